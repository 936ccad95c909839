package main

// A test-tooling difference from upstream, on purpose: upstream names a controller's API requests
// "<binary>/<version> (<os>/<arch>) kubernetes/<commit>/<client name>", which says neither which process
// sent them nor which controller (two controllers share the client name node-controller). The audit
// judges every write against its writer's Lease tenure, so here every controller's client names this
// process's Lease identity and the controller, in the Rust manager's form,
// "cloud-controller-manager/<version> (<os>/<arch>) <identity>/<controller>". Client names (and so
// service-account names), Leases, lock type and identities stay upstream's; the leader-election client
// and the provider's own client keep upstream's User-Agent.

import (
	"context"
	"sync"

	clientset "k8s.io/client-go/kubernetes"
	restclient "k8s.io/client-go/rest"
	cloudprovider "k8s.io/cloud-provider"
	"k8s.io/cloud-provider/app"
	"k8s.io/cloud-provider/app/config"
	genericcontrollermanager "k8s.io/controller-manager/app"
	"k8s.io/controller-manager/controller"
	"k8s.io/klog/v2"
)

// namingClientBuilder hands out upstream's clients, named for the controller being constructed.
type namingClientBuilder struct {
	inner cloudprovider.ControllerClientBuilder
	cloud *fakeCloud

	// constructing is held while one controller is constructed (upstream asks for its client then).
	constructing sync.Mutex
	mu           sync.RWMutex
	controller   string
}

// construct runs start with every client asked for meanwhile named for controller.
func (b *namingClientBuilder) construct(controller string, start func()) {
	b.constructing.Lock()
	defer b.constructing.Unlock()
	b.mu.Lock()
	b.controller = controller
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		b.controller = ""
		b.mu.Unlock()
	}()
	start()
}

func (b *namingClientBuilder) Config(name string) (*restclient.Config, error) {
	config, err := b.inner.Config(name)
	if err != nil {
		return nil, err
	}
	b.mu.RLock()
	controller := b.controller
	b.mu.RUnlock()
	if controller != "" {
		config.UserAgent = b.cloud.userAgent(controller)
	}
	return config, nil
}

func (b *namingClientBuilder) ConfigOrDie(name string) *restclient.Config {
	config, err := b.Config(name)
	if err != nil {
		klog.Fatal(err)
	}
	return config
}

func (b *namingClientBuilder) Client(name string) (clientset.Interface, error) {
	config, err := b.Config(name)
	if err != nil {
		return nil, err
	}
	return clientset.NewForConfig(config)
}

func (b *namingClientBuilder) ClientOrDie(name string) clientset.Interface {
	client, err := b.Client(name)
	if err != nil {
		klog.Fatal(err)
	}
	return client
}

// namingConstructors are upstream's controllers, each constructed with clients named for it.
func namingConstructors() map[string]app.ControllerInitFuncConstructor {
	constructors := make(map[string]app.ControllerInitFuncConstructor, len(app.DefaultInitFuncConstructors))
	for name, upstream := range app.DefaultInitFuncConstructors {
		constructors[name] = app.ControllerInitFuncConstructor{
			InitContext: upstream.InitContext,
			Constructor: func(initContext app.ControllerInitContext, completed *config.CompletedConfig, cloud cloudprovider.Interface) app.InitFunc {
				start := upstream.Constructor(initContext, completed, cloud)
				return func(ctx context.Context, controllerContext genericcontrollermanager.ControllerContext) (ctrl controller.Interface, enabled bool, err error) {
					builder, ok := completed.ClientBuilder.(*namingClientBuilder)
					if !ok {
						return start(ctx, controllerContext)
					}
					builder.construct(name, func() { ctrl, enabled, err = start(ctx, controllerContext) })
					return ctrl, enabled, err
				}
			},
		}
	}
	return constructors
}
