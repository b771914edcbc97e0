// Package rules holds the parts of container's contract that a client checks or prepares
// without a kernel: the resource limits' defaults, minimums and the one wording that refuses
// them (MemoryWant, PidsWant, CPUsWant), the rule for an image's name, and TarLayout, the tar
// of an OCI image layout that the image store's Import reads.
//
// It exists so that the thin client (cmd/enforcerctl, package internal/cli) can say exactly
// what the daemon would say about a bad --memory, --pids, --cpus or image name, and send an
// image, without linking package container (libcontainer, seccomp, cgroups): it imports only
// the standard library, and internal/depaware's test holds the thin client to that. Package
// container applies the same values (CheckResources, Manager.Create, the image store).
package rules
