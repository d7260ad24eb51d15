//! IPVS mode: the plan (virtual servers, real servers, ipsets, kube-ipvs0 addresses) and its executor.
