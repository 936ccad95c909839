// Command etcd is the upstream etcd server, built from its module for this project's tests (the store
// under the real kube-apiserver). Test tooling only: never shipped.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
