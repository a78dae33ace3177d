package e2estorage

// Gomega's formatting of Kubernetes objects, as upstream's e2e_test.go
// imports it. In its own file because the package moved in Kubernetes 1.37
// (from test/utils/format): the support matrix's older entries lay their
// own format.go over this one (e2e/cluster-bins/matrix.sh).
import _ "k8s.io/kubernetes/test/utils/format"
