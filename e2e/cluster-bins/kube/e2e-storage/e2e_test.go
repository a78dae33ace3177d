// Package e2estorage is Kubernetes' e2e.test with only the External Storage
// suite (test/e2e/storage/external) linked in, built with `go test -c` by
// e2e/cluster-bins/e2e-suite.sh at the pinned K8S_VERSION. See e2e/README.md
// ("Conformance").
//
// Why not `go test -c k8s.io/kubernetes/test/e2e`: that links every e2e test
// package (apps, network, DRA, …) that the External Storage run never
// selects. This binary keeps upstream's own suite set-up and runner — the
// package k8s.io/kubernetes/test/e2e itself (SynchronizedBeforeSuite,
// setupSuite, RunE2ETests; it also pulls in test/e2e/common) — and drops
// only the other test sources. The flags, the embedded manifests and
// `--version` are wired as upstream's test/e2e/e2e_test.go wires them.
package e2estorage

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"k8s.io/component-base/version"
	conformancetestdata "k8s.io/kubernetes/test/conformance/testdata"
	"k8s.io/kubernetes/test/e2e"
	"k8s.io/kubernetes/test/e2e/framework"
	"k8s.io/kubernetes/test/e2e/framework/config"
	"k8s.io/kubernetes/test/e2e/framework/testfiles"
	e2etestingmanifests "k8s.io/kubernetes/test/e2e/testing-manifests"
	testfixtures "k8s.io/kubernetes/test/fixtures"

	// define and freeze constants
	_ "k8s.io/kubernetes/test/e2e/feature"

	// the only test source: -storage.testdriver=<file>
	_ "k8s.io/kubernetes/test/e2e/storage/external"

	// reconfigure framework
	_ "k8s.io/kubernetes/test/e2e/framework/debug/init"
	_ "k8s.io/kubernetes/test/e2e/framework/metrics/init"
	_ "k8s.io/kubernetes/test/e2e/framework/node/init"
	// test/utils/ktesting/format (Gomega's object formatting): format.go,
	// whose path differs before 1.37 (the matrix entries replace it).
)

func handleFlags() {
	config.CopyFlags(config.Flags, flag.CommandLine)
	framework.RegisterCommonFlags(flag.CommandLine)
	framework.RegisterClusterFlags(flag.CommandLine)
	flag.Parse()
}

func TestMain(m *testing.M) {
	var versionFlag bool
	flag.CommandLine.BoolVar(&versionFlag, "version", false, "Displays version information.")
	handleFlags()

	if versionFlag {
		fmt.Printf("%s\n", version.Get())
		os.Exit(0)
	}
	if flag.CommandLine.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "unknown additional command line arguments: %s", flag.CommandLine.Args())
		os.Exit(1)
	}

	testfiles.AddFileSource(e2etestingmanifests.GetE2ETestingManifestsFS())
	testfiles.AddFileSource(testfixtures.GetTestFixturesFS())
	testfiles.AddFileSource(conformancetestdata.GetConformanceTestdataFS())

	framework.AfterReadingAllFlags(&framework.TestContext)
	if framework.TestContext.RepoRoot != "" {
		testfiles.AddFileSource(testfiles.RootFileSource{Root: framework.TestContext.RepoRoot})
	}
	os.Exit(m.Run())
}

func TestE2E(t *testing.T) {
	e2e.RunE2ETests(t)
}
