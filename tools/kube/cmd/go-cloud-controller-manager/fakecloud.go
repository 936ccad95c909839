package main

// The "fake" provider: this repository's fake cloud (crates/providers/kube-ccm-fake), spoken to over its HTTP
// protocol, one POST /cloud per call with a JSON body {"call": "..."} and an answer {"answer": "..."}.
// Every request names its caller in its User-Agent as the Rust manager's do,
// "<component>/<version> (<os>/<arch>) <identity>/<controller>", so the cloud's log of changes is judged
// against the Lease tenures alike: the identity is the holder of this process's main Lease when the
// provider is initialised (upstream initialises a provider after winning it), the controller the one that
// makes such a call (load balancers: service-lb-controller; routes: node-route-controller).

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	cloudprovider "k8s.io/cloud-provider"
	"k8s.io/component-base/version"
	"k8s.io/klog/v2"
	"sigs.k8s.io/yaml"
)

const providerName = "fake"

func init() {
	cloudprovider.RegisterCloudProvider(providerName, newFakeCloud)
}

// leaseRef is where this process's main Lease is (--leader-elect-resource-namespace/-name).
type leaseRef struct {
	elected   bool
	namespace string
	name      string
}

type fakeCloud struct {
	endpoint  string
	clusterID string
	lease     leaseRef
	http      *http.Client

	mu       sync.RWMutex
	identity string
}

// cloudConfig is the fake provider's --cloud-config (the keys a Go peer needs: a shared cloud).
type cloudConfig struct {
	Endpoint  string `json:"endpoint"`
	ClusterID string `json:"clusterID"`
}

func newFakeCloud(reader io.Reader) (cloudprovider.Interface, error) {
	if reader == nil {
		return nil, fmt.Errorf("--cloud-config: the fake provider needs one, with the endpoint of a shared fake cloud")
	}
	text, err := io.ReadAll(reader)
	if err != nil {
		return nil, fmt.Errorf("--cloud-config: %w", err)
	}
	var parsed cloudConfig
	if err := yaml.Unmarshal(text, &parsed); err != nil {
		return nil, fmt.Errorf("--cloud-config: %w", err)
	}
	if !strings.HasPrefix(parsed.Endpoint, "http://") {
		return nil, fmt.Errorf("--cloud-config: endpoint %q is not http://host:port (the Go peer acts only on a shared fake cloud)", parsed.Endpoint)
	}
	if parsed.ClusterID == "" {
		parsed.ClusterID = "fake-cluster"
	}
	host, _ := os.Hostname()
	return &fakeCloud{
		endpoint:  strings.TrimSuffix(parsed.Endpoint, "/"),
		clusterID: parsed.ClusterID,
		// A connection per call, as the Rust provider's: no request of an abandoned call is sent later.
		http:     &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 60 * time.Second},
		identity: host,
	}, nil
}

// Initialize learns this process's identity from its main Lease, which it holds now.
func (f *fakeCloud) Initialize(builder cloudprovider.ControllerClientBuilder, stop <-chan struct{}) {
	if !f.lease.elected {
		return
	}
	client, err := builder.Client("fake-cloud-provider")
	if err != nil {
		klog.Fatalf("fake cloud provider: no client: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	lease, err := client.CoordinationV1().Leases(f.lease.namespace).Get(ctx, f.lease.name, metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil {
		klog.Fatalf("fake cloud provider: cannot read the holder of Lease %s/%s: %v", f.lease.namespace, f.lease.name, err)
	}
	f.mu.Lock()
	f.identity = *lease.Spec.HolderIdentity
	f.mu.Unlock()
	klog.InfoS("fake cloud provider: requests name this process", "identity", *lease.Spec.HolderIdentity)
}

func (f *fakeCloud) userAgent(controller string) string {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return fmt.Sprintf("cloud-controller-manager/%s (%s/%s) %s/%s", version.Get().GitVersion, runtime.GOOS, runtime.GOARCH, f.identity, controller)
}

// answer is any of the cloud's answers.
type answer struct {
	Answer       string        `json:"answer"`
	Message      string        `json:"message"`
	NotFound     bool          `json:"not_found"`
	Instances    []*instance   `json:"instances"`
	LoadBalancer *loadBalancer `json:"load_balancer"`
	Routes       []route       `json:"routes"`
}

type address struct {
	Type    string `json:"type"`
	Address string `json:"address"`
}

type instance struct {
	Name         string            `json:"name"`
	ProviderID   string            `json:"providerID"`
	InstanceType string            `json:"instanceType"`
	Zone         string            `json:"zone"`
	Region       string            `json:"region"`
	Addresses    []address         `json:"addresses"`
	State        string            `json:"state"`
	Labels       map[string]string `json:"labels"`
}

type loadBalancer struct {
	Name string `json:"name"`
	IP   string `json:"ip"`
}

type route struct {
	Name                string    `json:"name"`
	TargetNode          string    `json:"target_node"`
	DestinationCIDR     string    `json:"destination_cidr"`
	TargetNodeAddresses []address `json:"target_node_addresses"`
}

// call sends one call for controller; a cloud error is an error.
func (f *fakeCloud) call(ctx context.Context, controller string, body map[string]any) (*answer, error) {
	payload, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	request, err := http.NewRequestWithContext(ctx, http.MethodPost, f.endpoint+"/cloud", bytes.NewReader(payload))
	if err != nil {
		return nil, err
	}
	request.Header.Set("Content-Type", "application/json")
	request.Header.Set("User-Agent", f.userAgent(controller))
	response, err := f.http.Do(request)
	if err != nil {
		return nil, fmt.Errorf("fake cloud at %s: %w", f.endpoint, err)
	}
	defer response.Body.Close()
	var parsed answer
	if err := json.NewDecoder(response.Body).Decode(&parsed); err != nil {
		return nil, fmt.Errorf("fake cloud at %s: %w", f.endpoint, err)
	}
	if parsed.Answer == "error" {
		return nil, fmt.Errorf("fake cloud: %s", parsed.Message)
	}
	return &parsed, nil
}

func (f *fakeCloud) LoadBalancer() (cloudprovider.LoadBalancer, bool) { return f, true }
func (f *fakeCloud) Instances() (cloudprovider.Instances, bool)       { return nil, false }
func (f *fakeCloud) InstancesV2() (cloudprovider.InstancesV2, bool)   { return f, true }
func (f *fakeCloud) Zones() (cloudprovider.Zones, bool)               { return nil, false }
func (f *fakeCloud) Clusters() (cloudprovider.Clusters, bool)         { return nil, false }
func (f *fakeCloud) Routes() (cloudprovider.Routes, bool)             { return f, true }
func (f *fakeCloud) ProviderName() string                             { return providerName }
func (f *fakeCloud) HasClusterID() bool                               { return f.clusterID != "" }

// describe looks node up (provider ID first, then name); nil when the cloud has no such instance.
func (f *fakeCloud) describe(ctx context.Context, node *v1.Node) (*instance, error) {
	ref := map[string]any{"name": node.Name}
	if node.Spec.ProviderID != "" {
		ref["provider_id"] = node.Spec.ProviderID
	}
	got, err := f.call(ctx, "cloud-node-controller", map[string]any{"call": "describe_instances", "nodes": []any{ref}})
	if err != nil {
		return nil, err
	}
	if len(got.Instances) != 1 {
		return nil, fmt.Errorf("fake cloud: %d answers for one node", len(got.Instances))
	}
	return got.Instances[0], nil
}

func (f *fakeCloud) InstanceExists(ctx context.Context, node *v1.Node) (bool, error) {
	found, err := f.describe(ctx, node)
	return found != nil, err
}

func (f *fakeCloud) InstanceShutdown(ctx context.Context, node *v1.Node) (bool, error) {
	found, err := f.describe(ctx, node)
	return found != nil && found.State == "stopped", err
}

func (f *fakeCloud) InstanceMetadata(ctx context.Context, node *v1.Node) (*cloudprovider.InstanceMetadata, error) {
	found, err := f.describe(ctx, node)
	if err != nil {
		return nil, err
	}
	if found == nil {
		return nil, cloudprovider.InstanceNotFound
	}
	providerID := found.ProviderID
	if providerID == "" {
		providerID = providerName + "://" + found.Name
	}
	addresses := make([]v1.NodeAddress, 0, len(found.Addresses))
	for _, a := range found.Addresses {
		addresses = append(addresses, v1.NodeAddress{Type: v1.NodeAddressType(a.Type), Address: a.Address})
	}
	return &cloudprovider.InstanceMetadata{
		ProviderID:       providerID,
		InstanceType:     found.InstanceType,
		NodeAddresses:    addresses,
		Zone:             found.Zone,
		Region:           found.Region,
		AdditionalLabels: found.Labels,
	}, nil
}

const serviceController = "service-lb-controller"

func (f *fakeCloud) GetLoadBalancerName(_ context.Context, _ string, service *v1.Service) string {
	return cloudprovider.DefaultLoadBalancerName(service)
}

func status(lb *loadBalancer) *v1.LoadBalancerStatus {
	return &v1.LoadBalancerStatus{Ingress: []v1.LoadBalancerIngress{{IP: lb.IP}}}
}

func (f *fakeCloud) GetLoadBalancer(ctx context.Context, cluster string, service *v1.Service) (*v1.LoadBalancerStatus, bool, error) {
	got, err := f.call(ctx, serviceController, map[string]any{"call": "get_load_balancer", "name": f.GetLoadBalancerName(ctx, cluster, service)})
	if err != nil || got.LoadBalancer == nil {
		return nil, false, err
	}
	return status(got.LoadBalancer), true, nil
}

func nodeNames(nodes []*v1.Node) []string {
	names := make([]string, 0, len(nodes))
	for _, node := range nodes {
		names = append(names, node.Name)
	}
	return names
}

func (f *fakeCloud) EnsureLoadBalancer(ctx context.Context, cluster string, service *v1.Service, nodes []*v1.Node) (*v1.LoadBalancerStatus, error) {
	ports := make([]int32, 0, len(service.Spec.Ports))
	for _, port := range service.Spec.Ports {
		ports = append(ports, port.Port)
	}
	got, err := f.call(ctx, serviceController, map[string]any{
		"call":    "ensure_load_balancer",
		"name":    f.GetLoadBalancerName(ctx, cluster, service),
		"service": service.Namespace + "/" + service.Name,
		"ports":   ports,
		"nodes":   nodeNames(nodes),
	})
	if err != nil {
		return nil, err
	}
	if got.LoadBalancer == nil {
		return nil, fmt.Errorf("fake cloud: ensure_load_balancer answered %q without a load balancer", got.Answer)
	}
	return status(got.LoadBalancer), nil
}

func (f *fakeCloud) UpdateLoadBalancer(ctx context.Context, cluster string, service *v1.Service, nodes []*v1.Node) error {
	_, err := f.call(ctx, serviceController, map[string]any{
		"call":  "update_load_balancer",
		"name":  f.GetLoadBalancerName(ctx, cluster, service),
		"nodes": nodeNames(nodes),
	})
	return err
}

func (f *fakeCloud) EnsureLoadBalancerDeleted(ctx context.Context, cluster string, service *v1.Service) error {
	_, err := f.call(ctx, serviceController, map[string]any{"call": "delete_load_balancer", "name": f.GetLoadBalancerName(ctx, cluster, service)})
	return err
}

const routeController = "node-route-controller"

func (f *fakeCloud) ListRoutes(ctx context.Context, _ string) ([]*cloudprovider.Route, error) {
	got, err := f.call(ctx, routeController, map[string]any{"call": "list_routes"})
	if err != nil {
		return nil, err
	}
	routes := make([]*cloudprovider.Route, 0, len(got.Routes))
	for _, r := range got.Routes {
		routes = append(routes, &cloudprovider.Route{
			Name:            r.Name,
			TargetNode:      types.NodeName(r.TargetNode),
			DestinationCIDR: r.DestinationCIDR,
			Blackhole:       r.TargetNode == "",
		})
	}
	return routes, nil
}

func (f *fakeCloud) CreateRoute(ctx context.Context, cluster string, nameHint string, r *cloudprovider.Route) error {
	addresses := make([]address, 0, len(r.TargetNodeAddresses))
	for _, a := range r.TargetNodeAddresses {
		addresses = append(addresses, address{Type: string(a.Type), Address: a.Address})
	}
	_, err := f.call(ctx, routeController, map[string]any{
		"call":                  "create_route",
		"name":                  cluster + "-" + nameHint,
		"target_node":           string(r.TargetNode),
		"destination_cidr":      r.DestinationCIDR,
		"target_node_addresses": addresses,
	})
	return err
}

func (f *fakeCloud) DeleteRoute(ctx context.Context, _ string, r *cloudprovider.Route) error {
	_, err := f.call(ctx, routeController, map[string]any{"call": "delete_route", "name": r.Name})
	return err
}
