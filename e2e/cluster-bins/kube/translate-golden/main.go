// Command translate-golden runs csi-translation-lib (the version
// kube-controller-manager of the test bed is built with) on the CSI
// migration cases of csiops' Rust translation, so its golden file
// (sidecars/src/common/migration/testdata/golden.json) is upstream's own
// output and the e2e test migration_golden checks that it still is.
//
//	translate-golden < cases.json > golden.json
//
// cases.json is a JSON array of
//
//	{"name": "...", "op": "storage-class" | "in-tree-pv-to-csi" |
//	 "csi-pv-to-in-tree" | "inline-to-csi",
//	 "plugin": "<in-tree plugin name, for storage-class>",
//	 "podNamespace": "<for inline-to-csi>",
//	 "object": {...}}
//
// and the output an array of {"name": "...", "output": {...}} or
// {"name": "...", "error": "..."} in the same order (a panic of the library
// is reported as an error starting with "panic:"; messages are cut at
// maxError bytes).
package main

import (
	"encoding/json"
	"fmt"
	"os"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	csitrans "k8s.io/csi-translation-lib"
	"k8s.io/klog/v2"
)

// maxError bounds the error messages kept in the golden file.
const maxError = 120

type testCase struct {
	Name         string          `json:"name"`
	Op           string          `json:"op"`
	Plugin       string          `json:"plugin,omitempty"`
	PodNamespace string          `json:"podNamespace,omitempty"`
	Object       json.RawMessage `json:"object"`
}

type result struct {
	Name   string      `json:"name"`
	Output interface{} `json:"output,omitempty"`
	Error  string      `json:"error,omitempty"`
}

func run(t csitrans.CSITranslator, c testCase) (out interface{}, err error) {
	defer func() {
		if r := recover(); r != nil {
			out, err = nil, fmt.Errorf("panic: %v", r)
		}
	}()
	logger := klog.Background()
	switch c.Op {
	case "storage-class":
		var sc storagev1.StorageClass
		if err := json.Unmarshal(c.Object, &sc); err != nil {
			return nil, fmt.Errorf("decoding the case: %w", err)
		}
		return t.TranslateInTreeStorageClassToCSI(logger, c.Plugin, &sc)
	case "in-tree-pv-to-csi":
		var pv v1.PersistentVolume
		if err := json.Unmarshal(c.Object, &pv); err != nil {
			return nil, fmt.Errorf("decoding the case: %w", err)
		}
		return t.TranslateInTreePVToCSI(logger, &pv)
	case "csi-pv-to-in-tree":
		var pv v1.PersistentVolume
		if err := json.Unmarshal(c.Object, &pv); err != nil {
			return nil, fmt.Errorf("decoding the case: %w", err)
		}
		return t.TranslateCSIPVToInTree(&pv)
	case "inline-to-csi":
		var vol v1.Volume
		if err := json.Unmarshal(c.Object, &vol); err != nil {
			return nil, fmt.Errorf("decoding the case: %w", err)
		}
		return t.TranslateInTreeInlineVolumeToCSI(logger, &vol, c.PodNamespace)
	default:
		return nil, fmt.Errorf("unknown op %q", c.Op)
	}
}

func main() {
	var cases []testCase
	if err := json.NewDecoder(os.Stdin).Decode(&cases); err != nil {
		fmt.Fprintf(os.Stderr, "reading the cases: %v\n", err)
		os.Exit(1)
	}
	t := csitrans.New()
	results := make([]result, 0, len(cases))
	for _, c := range cases {
		out, err := run(t, c)
		r := result{Name: c.Name}
		if err != nil {
			// Some messages embed the whole PV: the start says enough.
			r.Error = err.Error()
			if len(r.Error) > maxError {
				r.Error = r.Error[:maxError] + "..."
			}
		} else {
			r.Output = out
		}
		results = append(results, r)
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(results); err != nil {
		fmt.Fprintf(os.Stderr, "writing the results: %v\n", err)
		os.Exit(1)
	}
}
