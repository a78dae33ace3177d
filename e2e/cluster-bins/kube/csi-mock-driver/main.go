// Command csi-mock-driver serves the CSI mock driver that Kubernetes' own
// storage e2e tests use (k8s.io/kubernetes/test/e2e/storage/drivers/csi-test)
// on a unix socket, as a stand-in for csi-driver-host-path's hostpathplugin,
// which the module proxy here refuses to serve. See e2e/README.md.
//
// This file is glue only: flags, the listener, signals, and the node ID. All
// CSI behaviour (Identity, Controller and Node services, the in-memory
// volumes, the one-line JSON log of every call) is upstream code.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"k8s.io/klog/v2"

	"k8s.io/kubernetes/test/e2e/storage/drivers/csi-test/driver"
	"k8s.io/kubernetes/test/e2e/storage/drivers/csi-test/mock/service"
)

// upstream is the module the CSI code is compiled from.
const upstream = "k8s.io/kubernetes"

func main() {
	var (
		endpoint       = flag.String("endpoint", "", "unix socket to serve on: a path or a unix:// URL (a stale socket is removed first)")
		driverName     = flag.String("drivername", service.Name, "CSI driver name returned by GetPluginInfo")
		nodeID         = flag.String("nodeid", "", "node_id returned by NodeGetInfo (default: the driver name, as upstream)")
		attachLimit    = flag.Int64("attach-limit", 0, "max_volumes_per_node returned by NodeGetInfo (0: not set)")
		enableTopology = flag.Bool("enable-topology", false, "report accessible_topology {"+service.TopologyKey+": "+service.TopologyValue+"} and the VOLUME_ACCESSIBILITY_CONSTRAINTS capability")
		disableAttach  = flag.Bool("disable-attach", false, "do not advertise PUBLISH_UNPUBLISH_VOLUME (ControllerPublish/Unpublish return Unimplemented)")
		showVersion    = flag.Bool("version", false, "print the Kubernetes version this driver comes from and exit")
	)
	// klog's flags (-v, ...) stay available. Upstream logs every gRPC call
	// as one "gRPCCall: {json}" line at V(3), so that is the default.
	klog.InitFlags(flag.CommandLine)
	_ = flag.Set("v", "3")
	flag.Parse()
	if flag.NArg() > 0 {
		fail("unexpected arguments: %q", flag.Args())
	}

	if *showVersion {
		fmt.Printf("csi-mock-driver %s %s (test/e2e/storage/drivers/csi-test, vendor_version %s)\n",
			upstream, upstreamVersion(), service.VendorVersion)
		return
	}
	sock, err := socketPath(*endpoint)
	if err != nil {
		fail("%v", err)
	}
	if *driverName == "" {
		fail("--drivername must not be empty")
	}
	if *attachLimit < 0 {
		fail("--attach-limit must be >= 0")
	}

	svc := service.New(service.Config{
		DriverName:     *driverName,
		AttachLimit:    *attachLimit,
		EnableTopology: *enableTopology,
		DisableAttach:  *disableAttach,
	})
	servers := &driver.CSIDriverServers{
		Identity:   svc,
		Controller: anyNodeController{ControllerServer: svc, internal: *driverName},
		Node:       svc,
	}
	if *nodeID != "" {
		servers.Node = nodeIDNode{NodeServer: svc, nodeID: *nodeID}
	}

	if err := removeStaleSocket(sock); err != nil {
		fail("%v", err)
	}
	if err := os.MkdirAll(filepath.Dir(sock), 0o755); err != nil {
		fail("%v", err)
	}
	l, err := net.Listen("unix", sock)
	if err != nil {
		fail("listen: %v", err)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	d := driver.NewCSIDriver(servers)
	// nil interceptor: upstream's, which logs each call (and checks no
	// secrets, since no credentials are configured).
	if err := d.Start(l, nil); err != nil {
		_ = l.Close()
		_ = os.Remove(sock)
		fail("start: %v", err)
	}
	klog.Infof("csi-mock-driver %s %s: serving %s on unix://%s (node_id=%q attach_limit=%d topology=%v attach=%v)",
		upstream, upstreamVersion(), *driverName, sock, effective(*nodeID, *driverName), *attachLimit, *enableTopology, !*disableAttach)

	<-ctx.Done()
	klog.Infof("csi-mock-driver: signal received, stopping")
	d.Stop()
	if err := os.Remove(sock); err != nil && !errors.Is(err, fs.ErrNotExist) {
		klog.Errorf("remove %s: %v", sock, err)
	}
	klog.Flush()
}

// nodeIDNode reports --nodeid instead of the mock's built-in node ID (which
// is the driver name, so every simulated node would look the same).
type nodeIDNode struct {
	csi.NodeServer
	nodeID string
}

func (n nodeIDNode) NodeGetInfo(ctx context.Context, req *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	rsp, err := n.NodeServer.NodeGetInfo(ctx, req)
	if rsp != nil {
		rsp.NodeId = n.nodeID
	}
	return rsp, err
}

// anyNodeController lets one controller instance (which is usually started
// without --nodeid) serve every simulated node: the mock accepts
// ControllerPublish/Unpublish only for its built-in node ID (the driver
// name), and each node reports its own --nodeid, so a request's node_id is
// mapped to the built-in one. Attachments (and --attach-limit on
// ControllerPublish) are therefore tracked per driver, not per node.
type anyNodeController struct {
	csi.ControllerServer
	internal string
}

func (c anyNodeController) ControllerPublishVolume(ctx context.Context, req *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
	if req.GetNodeId() != "" {
		r := *req // csi v1.9.0 structs are plain (APIv1) messages; the logged request stays intact
		r.NodeId = c.internal
		req = &r
	}
	return c.ControllerServer.ControllerPublishVolume(ctx, req)
}

func (c anyNodeController) ControllerUnpublishVolume(ctx context.Context, req *csi.ControllerUnpublishVolumeRequest) (*csi.ControllerUnpublishVolumeResponse, error) {
	if req.GetNodeId() != "" {
		r := *req // csi v1.9.0 structs are plain (APIv1) messages; the logged request stays intact
		r.NodeId = c.internal
		req = &r
	}
	return c.ControllerServer.ControllerUnpublishVolume(ctx, req)
}

// socketPath accepts "/path", "unix:///path" and "unix:/path".
func socketPath(endpoint string) (string, error) {
	p := endpoint
	if strings.Contains(p, "://") || strings.HasPrefix(p, "unix:") {
		rest, ok := strings.CutPrefix(p, "unix:")
		if !ok {
			return "", fmt.Errorf("--endpoint %q: only unix sockets are supported", endpoint)
		}
		p = rest
		if strings.HasPrefix(p, "//") {
			p = strings.TrimPrefix(p, "//")
			if !strings.HasPrefix(p, "/") {
				return "", fmt.Errorf("--endpoint %q: want unix:///absolute/path", endpoint)
			}
		}
	}
	if p == "" {
		return "", errors.New("--endpoint is required (a unix socket path or unix:// URL)")
	}
	return filepath.Clean(p), nil
}

// removeStaleSocket removes a socket left by a previous run. It refuses to
// remove anything that is not a socket, or a socket someone still serves.
func removeStaleSocket(p string) error {
	fi, err := os.Lstat(p)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return err
	case fi.Mode().Type() != fs.ModeSocket:
		return fmt.Errorf("--endpoint %s exists and is not a socket", p)
	}
	if c, err := net.DialTimeout("unix", p, time.Second); err == nil {
		_ = c.Close()
		return fmt.Errorf("--endpoint %s is in use by another process", p)
	}
	return os.Remove(p)
}

func upstreamVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, m := range bi.Deps {
			if m.Path == upstream {
				if m.Replace != nil {
					return m.Replace.Version
				}
				return m.Version
			}
		}
	}
	return "(unknown)"
}

func effective(nodeID, driverName string) string {
	if nodeID == "" {
		return driverName
	}
	return nodeID
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "csi-mock-driver: "+format+"\n", args...)
	os.Exit(2)
}
