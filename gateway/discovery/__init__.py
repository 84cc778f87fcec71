"""Kubernetes service discovery: engines (and the cluster's own nodes) found as pods by label.

    config       DiscoveryConfig, the flags' settings, and selector parsing
    pods         what a pod says (pure): Ready with an IP, its role, its worker URL; the cache a watch keeps
    credentials  how to reach the API server: in the cluster (service account) or from a kubeconfig
    kube_api     the API server's list and watch calls, over HTTP with the credentials
    watch        one label selector's pods: list, then watch from the list's resourceVersion, 410, backoff
    reconcile    the discovered workers into the registry (alone) or the cluster's worker document (meshed)
    seeds        router pods as mesh seeds: a Deployment of nodes forms its mesh with no seed list

Kept out of the request path: nothing here runs per request.
"""
