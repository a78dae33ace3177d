// Command regclient calls a unix-socket gRPC server the way kubelet does, so
// the e2e tests can check our servers against a real grpc-go client that
// shares no code with our Rust one.
//
//	regclient register -socket=PATH [-refuse=ERROR]
//	    kubelet's plugin registration: GetInfo, then NotifyRegistrationStatus
//	    (registered, or refused with ERROR); prints
//	    {"info": {...}, "notified": {"plugin_registered": ..., "error": ...}}
//	regclient csi -socket=PATH
//	    kubelet's first calls to a CSI driver: GetPluginInfo and Probe; prints
//	    {"plugin_info": {...}, "probe": {...}}
//	regclient -version
//
// The connection is made exactly as kubelet v1.34's plugin registration does
// (pkg/kubelet/pluginmanager/operationexecutor/operation_generator.go, dial):
// the raw socket path as the target, insecure credentials, a unix context
// dialer and a blocking dial, so grpc-go sends the path as :authority.
// On failure it prints the gRPC error on stderr and exits 1.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"runtime/debug"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

func main() {
	showVersion := flag.Bool("version", false, "print the grpc-go and kubelet API versions and exit")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: regclient register|csi -socket=PATH [-refuse=ERROR] [-timeout=10s]")
		flag.PrintDefaults()
	}
	flag.Parse()
	if *showVersion {
		fmt.Printf("regclient k8s.io/kubelet %s google.golang.org/grpc %s\n",
			depVersion("k8s.io/kubelet"), depVersion("google.golang.org/grpc"))
		return
	}
	if flag.NArg() < 1 {
		flag.Usage()
		os.Exit(2)
	}
	cmd := flag.NewFlagSet(flag.Arg(0), flag.ExitOnError)
	socket := cmd.String("socket", "", "unix socket path, passed to grpc-go as the target as is")
	refuse := cmd.String("refuse", "", "register: report the registration refused with this error")
	timeout := cmd.Duration("timeout", 10*time.Second, "for the dial and for each call")
	_ = cmd.Parse(flag.Args()[1:])
	if *socket == "" || cmd.NArg() > 0 {
		flag.Usage()
		os.Exit(2)
	}

	conn, err := dial(*socket, *timeout)
	if err != nil {
		fail("%v", err)
	}
	defer conn.Close()

	var out any
	switch flag.Arg(0) {
	case "register":
		out, err = register(conn, *refuse, *timeout)
	case "csi":
		out, err = csiCalls(conn, *timeout)
	default:
		flag.Usage()
		os.Exit(2)
	}
	if err != nil {
		fail("%v", err)
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fail("%v", err)
	}
}

// dial is kubelet's: the socket path is the target.
func dial(socket string, timeout time.Duration) (*grpc.ClientConn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	//nolint:staticcheck // DialContext and WithBlock, as kubelet uses them.
	c, err := grpc.DialContext(ctx, socket,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithBlock(),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", addr)
		}),
	)
	if err != nil {
		return nil, fmt.Errorf("failed to dial socket %s, err: %v", socket, err)
	}
	return c, nil
}

type registration struct {
	Info     *registerapi.PluginInfo `json:"info"`
	Notified notified                `json:"notified"`
}

// notified is what was sent, without the generated type's omitempty.
type notified struct {
	PluginRegistered bool   `json:"plugin_registered"`
	Error            string `json:"error"`
}

func register(conn *grpc.ClientConn, refuse string, timeout time.Duration) (any, error) {
	client := registerapi.NewRegistrationClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	info, err := client.GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		return nil, fmt.Errorf("GetInfo: %v", err)
	}
	status := &registerapi.RegistrationStatus{PluginRegistered: refuse == "", Error: refuse}
	if _, err := client.NotifyRegistrationStatus(ctx, status); err != nil {
		return nil, fmt.Errorf("NotifyRegistrationStatus: %v", err)
	}
	return registration{Info: info, Notified: notified{status.PluginRegistered, status.Error}}, nil
}

type csiAnswers struct {
	PluginInfo *csi.GetPluginInfoResponse `json:"plugin_info"`
	Probe      *csi.ProbeResponse         `json:"probe"`
}

func csiCalls(conn *grpc.ClientConn, timeout time.Duration) (any, error) {
	client := csi.NewIdentityClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	info, err := client.GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
	if err != nil {
		return nil, fmt.Errorf("GetPluginInfo: %v", err)
	}
	probe, err := client.Probe(ctx, &csi.ProbeRequest{})
	if err != nil {
		return nil, fmt.Errorf("Probe: %v", err)
	}
	return csiAnswers{PluginInfo: info, Probe: probe}, nil
}

func depVersion(path string) string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, m := range bi.Deps {
			if m.Path == path {
				if m.Replace != nil {
					return m.Replace.Version
				}
				return m.Version
			}
		}
	}
	return "(unknown)"
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "regclient: "+format+"\n", args...)
	os.Exit(1)
}
