// Command go-cloud-controller-manager is upstream's cloud-controller-manager, built from
// k8s.io/cloud-provider's app package at the pinned release with a provider named "fake" that acts on
// this repository's fake cloud over its HTTP protocol (POST /cloud, JSON), the same cloud the Rust
// manager's fake provider acts on. It is the Go peer of this project's tests and benchmarks: the same
// flags, Lease names, lock type and identity scheme as any upstream CCM. Test tooling only: never shipped.
package main

import (
	"os"
	_ "time/tzdata"

	"k8s.io/apimachinery/pkg/util/wait"
	cloudprovider "k8s.io/cloud-provider"
	"k8s.io/cloud-provider/app"
	"k8s.io/cloud-provider/app/config"
	"k8s.io/cloud-provider/names"
	"k8s.io/cloud-provider/options"
	"k8s.io/component-base/cli"
	cliflag "k8s.io/component-base/cli/flag"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/klog/v2"
)

func main() {
	opts, err := options.NewCloudControllerManagerOptions()
	if err != nil {
		klog.Fatalf("unable to initialize command options: %v", err)
	}
	command := app.NewCloudControllerManagerCommand(opts, initialize, namingConstructors(),
		names.CCMControllerAliases(), cliflag.NamedFlagSets{}, wait.NeverStop)
	os.Exit(cli.Run(command))
}

// initialize builds the provider --cloud-provider names from --cloud-config, telling the fake one where
// its main Lease is, so that it can name its process in every cloud request, and names it in every
// controller's API requests too (naming.go).
func initialize(c *config.CompletedConfig) cloudprovider.Interface {
	shared := c.ComponentConfig.KubeCloudShared.CloudProvider
	cloud, err := cloudprovider.InitCloudProvider(shared.Name, shared.CloudConfigFile)
	if err != nil || cloud == nil {
		klog.Fatalf("cloud provider %q could not be initialized: %v", shared.Name, err)
	}
	if fake, ok := cloud.(*fakeCloud); ok {
		election := c.ComponentConfig.Generic.LeaderElection
		fake.lease = leaseRef{
			elected:   election.LeaderElect,
			namespace: election.ResourceNamespace,
			name:      election.ResourceName,
		}
		c.ClientBuilder = &namingClientBuilder{inner: c.ClientBuilder, cloud: fake}
	}
	return cloud
}
