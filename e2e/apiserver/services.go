package apiserver

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
)

// ServiceName is the name CreateServices gives its i-th Service.
func ServiceName(i int) string { return fmt.Sprintf("svc-%05d", i) }

// CreateServices creates namespace ns and in it n ClusterIP Services, each
// with one named port (http 80 → 8080) and, as the endpointslice controller
// would, one EndpointSlice of m ready endpoints; 32 requests at a time.
func CreateServices(ctx context.Context, client kubernetes.Interface, ns string, n, m int) error {
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	var next atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n || ctx.Err() != nil {
					return
				}
				if err := createService(ctx, client, ns, i, m); err != nil {
					once.Do(func() { firstErr = err })
					return
				}
			}
		})
	}
	wg.Wait()
	if firstErr == nil {
		firstErr = ctx.Err()
	}
	return firstErr
}

func createService(ctx context.Context, client kubernetes.Interface, ns string, i, m int) error {
	svc := serviceObject(ns, i)
	if _, err := client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create service %s: %w", svc.Name, err)
	}
	slice := sliceObject(ns, i, m)
	if _, err := client.DiscoveryV1().EndpointSlices(ns).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create endpointslice %s: %w", slice.Name, err)
	}
	return nil
}

// serviceObject is the i-th Service as CreateServices sends it.
func serviceObject(ns string, i int) *corev1.Service {
	name := ServiceName(i)
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": name}},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": name},
			Ports:    []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}},
		},
	}
}

// sliceObject is the i-th Service's EndpointSlice of m ready endpoints as
// CreateServices sends it.
func sliceObject(ns string, i, m int) *discoveryv1.EndpointSlice {
	name := ServiceName(i)
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: name + "-abcde", Namespace: ns,
			Labels: map[string]string{discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io"},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: new("http"), Port: new(int32(8080)), Protocol: new(corev1.ProtocolTCP)}},
	}
	for j := range m {
		node := fmt.Sprintf("node-%d", (i+j)%100)
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{fmt.Sprintf("10.%d.%d.%d", 244+i/65536%8, i/256%256, i%256/26*10+j+1)},
			Conditions: discoveryv1.EndpointConditions{Ready: new(true), Serving: new(true), Terminating: new(false)},
			NodeName:   &node,
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: fmt.Sprintf("%s-%d", name, j)},
		})
	}
	return slice
}
