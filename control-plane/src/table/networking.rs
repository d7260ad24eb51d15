//! Server-side printing of `networking.k8s.io/v1` and `discovery.k8s.io/v1`: ingresses, ingress
//! classes, network policies, endpoint slices.

use super::*;

pub(super) const INGRESS_COLUMNS: &[Column] = &[
    NAME,
    col("Class", "string", "The name of the IngressClass resource that should be used for additional configuration"),
    col("Hosts", "string", "Hosts that incoming requests are matched against before the ingress rule"),
    col("Address", "string", "Address is a list containing ingress points for the load-balancer"),
    col("Ports", "string", "Ports of TLS configurations that open"),
    AGE,
];

pub(super) const INGRESS_CLASS_COLUMNS: &[Column] = &[
    NAME,
    col("Controller", "string", "Controller that is responsible for handling this class"),
    col("Parameters", "string", "A reference to a resource with additional parameters"),
    AGE,
];

pub(super) const NETWORK_POLICY_COLUMNS: &[Column] = &[NAME, col("Pod-Selector", "string", D_NP_POD_SELECTOR), AGE];

pub(super) const ENDPOINT_SLICE_COLUMNS: &[Column] = &[
    NAME,
    col("AddressType", "string", D_ES_ADDRESS_TYPE),
    col("Ports", "string", D_ES_PORTS),
    col("Endpoints", "string", D_ES_ENDPOINTS),
    AGE,
];

pub(super) fn ingress_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
    let rules = list(obj, &["spec", "rules"]);
    let mut hosts: Vec<&str> = Vec::new();
    let mut more = false;
    for rule in rules {
        if hosts.len() == 3 {
            more = true;
        }
        let host = st(rule, &["host"]);
        if !more && !host.is_empty() {
            hosts.push(host);
        }
    }
    let hosts = if hosts.is_empty() {
        "*".to_string()
    } else if more {
        format!("{} + {} more...", hosts.join(","), rules.len() - 3)
    } else {
        hosts.join(",")
    };
    let ports = if list(obj, &["spec", "tls"]).is_empty() { "80" } else { "80, 443" };
    vec![
        name(obj),
        s(at(obj, &["spec", "ingressClassName"]).and_then(Value::as_str).unwrap_or("<none>")),
        s(hosts),
        s(load_balancer_ingress(obj)),
        s(ports),
        age(obj, now),
    ]
}

pub(super) fn ingress_class_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
    let parameters = match at(obj, &["spec", "parameters"]) {
        None => "<none>".to_string(),
        Some(p) => {
            let mut text = st(p, &["kind"]).to_string();
            if let Some(group) = at(p, &["apiGroup"]).and_then(Value::as_str) {
                text = format!("{text}.{group}");
            }
            format!("{text}/{}", st(p, &["name"]))
        }
    };
    vec![name(obj), s(st(obj, &["spec", "controller"])), s(parameters), age(obj, now)]
}

pub(super) fn endpoint_slice_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
    let ports: Vec<String> = list(obj, &["ports"])
        .iter()
        .map(|p| match (at(p, &["port"]).and_then(Value::as_i64), at(p, &["name"]).and_then(Value::as_str)) {
            (Some(port), _) => port.to_string(),
            (None, Some(port_name)) => port_name.to_string(),
            (None, None) => "*".to_string(),
        })
        .collect();
    let addresses: Vec<String> = list(obj, &["endpoints"])
        .iter()
        .flat_map(|e| list(e, &["addresses"]).iter().map(|a| a.as_str().unwrap_or("").to_string()))
        .collect();
    vec![
        name(obj),
        s(st(obj, &["addressType"])),
        s(list_with_more(ports)),
        s(list_with_more(addresses)),
        age(obj, now),
    ]
}

pub(super) fn network_policy_cells(obj: &Value, now: Timestamp) -> Vec<Value> {
    vec![name(obj), s(format_label_selector(at(obj, &["spec", "podSelector"]))), age(obj, now)]
}

// Column descriptions: upstream takes them from the API types' documentation.

const D_NP_POD_SELECTOR: &str = "podSelector selects the pods to which this NetworkPolicy object applies. The array of ingress rules is applied to any pods selected by this field. Multiple network policies can select the same set of pods. In this case, the ingress rules for each are combined additively. This field is NOT optional and follows standard label selector semantics. An empty podSelector matches all pods in this namespace.";
const D_ES_ADDRESS_TYPE: &str = "addressType specifies the type of address carried by this EndpointSlice. All addresses in this slice must be the same type. This field is immutable after creation. The following address types are currently supported: * IPv4: Represents an IPv4 Address. * IPv6: Represents an IPv6 Address. * FQDN: Represents a Fully Qualified Domain Name. (Deprecated) The EndpointSlice controller only generates, and kube-proxy only processes, slices of addressType \"IPv4\" and \"IPv6\". No semantics are defined for the \"FQDN\" type.";
const D_ES_PORTS: &str = "ports specifies the list of network ports exposed by each endpoint in this slice. Each port must have a unique name. Each slice may include a maximum of 100 ports. Services always have at least 1 port, so EndpointSlices generated by the EndpointSlice controller will likewise always have at least 1 port. EndpointSlices used for other purposes may have an empty ports list.";
const D_ES_ENDPOINTS: &str = "endpoints is a list of unique endpoints in this slice. Each slice may include a maximum of 1000 endpoints.";
