// sie-k8s: the Kubernetes pieces SIE's tests run against, in one binary built
// from Go modules (no image registry, no kubelet). scripts/k8s_tools.sh builds
// it once per machine and links it under two names:
//
//	kube-apiserver  an embedded etcd (SIE_ETCD_DATA_DIR, SIE_ETCD_CLIENT_URL,
//	                SIE_ETCD_PEER_URL) plus kube-apiserver with the given flags
//	kubectl         kubectl, exactly as upstream's cmd/kubectl
//
// One binary instead of two saves a second ~150 MB link on a 2-core machine;
// the dispatch is on the name it was started under.
package main

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"k8s.io/component-base/cli"
	kubectl "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	switch name := filepath.Base(os.Args[0]); name {
	case "kubectl":
		command := kubectl.NewDefaultKubectlCommand()
		if err := cli.RunNoErrOutput(command); err != nil {
			kubectlutil.CheckErr(err)
		}
	case "kube-apiserver":
		os.Exit(apiserver())
	default:
		fmt.Fprintf(os.Stderr, "sie-k8s: started as %q; run it as kubectl or kube-apiserver (symlinks)\n", name)
		os.Exit(2)
	}
}

// apiserver starts the embedded etcd (when SIE_ETCD_DATA_DIR is set), then
// kube-apiserver; on the apiserver's exit it closes etcd so the data dir is
// left consistent.
func apiserver() int {
	dir := os.Getenv("SIE_ETCD_DATA_DIR")
	if dir == "" {
		return cli.Run(app.NewAPIServerCommand())
	}
	client, err := url.Parse(envOr("SIE_ETCD_CLIENT_URL", "http://127.0.0.1:2379"))
	if err != nil {
		fmt.Fprintf(os.Stderr, "SIE_ETCD_CLIENT_URL: %v\n", err)
		return 2
	}
	peer, err := url.Parse(envOr("SIE_ETCD_PEER_URL", "http://127.0.0.1:2380"))
	if err != nil {
		fmt.Fprintf(os.Stderr, "SIE_ETCD_PEER_URL: %v\n", err)
		return 2
	}
	cfg := embed.NewConfig()
	cfg.Dir = dir
	cfg.ListenClientUrls = []url.URL{*client}
	cfg.AdvertiseClientUrls = []url.URL{*client}
	cfg.ListenPeerUrls = []url.URL{*peer}
	cfg.AdvertisePeerUrls = []url.URL{*peer}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.LogLevel = "error"
	etcd, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "embedded etcd: %v\n", err)
		return 1
	}
	select {
	case <-etcd.Server.ReadyNotify():
	case <-time.After(120 * time.Second):
		etcd.Close()
		fmt.Fprintln(os.Stderr, "embedded etcd: not ready after 120 s")
		return 1
	}
	code := cli.Run(app.NewAPIServerCommand())
	etcd.Close()
	return code
}

func envOr(key, fallback string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return fallback
}
