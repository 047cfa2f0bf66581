// sie-k8s-node: the node half of SIE's one-node cluster (scripts/k8s_node.sh),
// in one binary built from k8s.io/kubernetes (the same version as the
// apiserver in ../main.go) and linked under four names:
//
//	kubelet                  cmd/kubelet (cgroup v1 hosts need failCgroupV1: false)
//	kube-controller-manager  cmd/kube-controller-manager
//	kube-scheduler           cmd/kube-scheduler
//	kube-proxy               cmd/kube-proxy (ClusterIP Services)
//
// A module of its own (not ../go.mod), so the apiserver binary's stamp and
// build stay as they are; the Go build cache shares the common packages.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	_ "time/tzdata" // CronJob time zones, as upstream's controller-manager

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	proxy "k8s.io/kubernetes/cmd/kube-proxy/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

func main() {
	switch name := filepath.Base(os.Args[0]); name {
	case "kubelet":
		os.Exit(cli.Run(kubelet.NewKubeletCommand(context.Background())))
	case "kube-controller-manager":
		os.Exit(cli.Run(controllermanager.NewControllerManagerCommand()))
	case "kube-scheduler":
		os.Exit(cli.Run(scheduler.NewSchedulerCommand()))
	case "kube-proxy":
		os.Exit(cli.Run(proxy.NewProxyCommand()))
	default:
		fmt.Fprintf(os.Stderr, "sie-k8s-node: started as %q; run it as kubelet, kube-controller-manager, kube-scheduler or kube-proxy (symlinks)\n", name)
		os.Exit(2)
	}
}
