// Command draplugin is the suite's DRA driver for its real kubelet node: the kubelet plugin of a
// driver that advertises fake GPUs, as a real GPU driver advertises real ones. It publishes the
// node's devices in a ResourceSlice (product name, memory, index), and when the kubelet prepares a
// claim allocated some of them it writes a CDI spec giving the container each device as an
// environment variable (GPU_DEVICE_<index>=<device>), so a container sees exactly its devices.
//
//	draplugin --driver gpu.example.com --node real-0 --kubeconfig K --registry DIR --data DIR --cdi DIR --gpus 2 --product NAME
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	resourceapi "k8s.io/api/resource/v1"
	apiresource "k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"
)

type driver struct {
	name, cdiDir string
}

// cdiKind is the CDI vendor/class of the driver's devices: "<driver>/gpu".
func (d *driver) cdiKind() string { return d.name + "/gpu" }

func (d *driver) specPath(claim types.UID) string {
	return filepath.Join(d.cdiDir, strings.ReplaceAll(d.name, ".", "-")+"-"+string(claim)+".json")
}

// PrepareResourceClaims writes one CDI spec per claim: a CDI device per allocated device, whose
// container edit is the variable that names it.
func (d *driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := map[types.UID]kubeletplugin.PrepareResult{}
	for _, claim := range claims {
		var devices []kubeletplugin.Device
		var specDevices []map[string]any
		if claim.Status.Allocation != nil {
			for _, result := range claim.Status.Allocation.Devices.Results {
				if result.Driver != d.name {
					continue
				}
				index := strings.TrimPrefix(result.Device, "gpu-")
				cdiName := string(claim.UID) + "-" + result.Device
				specDevices = append(specDevices, map[string]any{
					"name":           cdiName,
					"containerEdits": map[string]any{"env": []string{fmt.Sprintf("GPU_DEVICE_%s=%s", index, result.Device)}},
				})
				devices = append(devices, kubeletplugin.Device{
					Requests: []string{result.Request}, PoolName: result.Pool, DeviceName: result.Device,
					CDIDeviceIDs: []string{d.cdiKind() + "=" + cdiName},
				})
			}
		}
		spec, _ := json.Marshal(map[string]any{"cdiVersion": "0.6.0", "kind": d.cdiKind(), "devices": specDevices})
		if err := os.WriteFile(d.specPath(claim.UID), spec, 0o644); err != nil {
			out[claim.UID] = kubeletplugin.PrepareResult{Err: err}
			continue
		}
		out[claim.UID] = kubeletplugin.PrepareResult{Devices: devices}
	}
	return out, nil
}

// UnprepareResourceClaims removes the claims' CDI specs.
func (d *driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := map[types.UID]error{}
	for _, claim := range claims {
		if err := os.Remove(d.specPath(claim.UID)); err != nil && !os.IsNotExist(err) {
			out[claim.UID] = err
		} else {
			out[claim.UID] = nil
		}
	}
	return out, nil
}

func (d *driver) HandleError(ctx context.Context, err error, msg string) {
	fmt.Fprintf(os.Stderr, "draplugin: %s: %v\n", msg, err)
}

func main() {
	name := flag.String("driver", "gpu.example.com", "driver name (and CDI vendor)")
	node := flag.String("node", "", "node name")
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig")
	registry := flag.String("registry", "", "the kubelet's plugin registration directory")
	data := flag.String("data", "", "this plugin's directory (its socket)")
	cdiDir := flag.String("cdi", "/var/run/cdi", "where the container runtime reads CDI specs")
	gpus := flag.Int("gpus", 2, "how many GPUs the node has")
	product := flag.String("product", "NVIDIA H100 80GB HBM3", "their product name")
	flag.Parse()

	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		panic(err)
	}
	client := kubernetes.NewForConfigOrDie(config)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	for _, dir := range []string{*registry, *data, *cdiDir} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			panic(err)
		}
	}
	d := &driver{name: *name, cdiDir: *cdiDir}
	helper, err := kubeletplugin.Start(ctx, d, kubeletplugin.KubeClient(client), kubeletplugin.NodeName(*node),
		kubeletplugin.DriverName(*name), kubeletplugin.RegistrarDirectoryPath(*registry),
		kubeletplugin.PluginDataDirectoryPath(*data))
	if err != nil {
		panic(err)
	}
	defer helper.Stop()
	var devices []resourceapi.Device
	for i := 0; i < *gpus; i++ {
		devices = append(devices, resourceapi.Device{
			Name: fmt.Sprintf("gpu-%d", i),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"productName": {StringValue: ptr.To(*product)}, "index": {IntValue: ptr.To(int64(i))}},
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
				"memory": {Value: apiresource.MustParse("80Gi")}},
		})
	}
	if err := helper.PublishResources(ctx, resourceslice.DriverResources{
		Pools: map[string]resourceslice.Pool{*node: {Slices: []resourceslice.Slice{{Devices: devices}}}}}); err != nil {
		panic(err)
	}
	fmt.Println("draplugin: serving", *gpus, "devices of", *name, "on node", *node)
	<-ctx.Done()
}
