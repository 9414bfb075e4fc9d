//! The rendered NetworkPolicies, evaluated: a small model of NetworkPolicy semantics (a pod is
//! isolated in a direction once a policy of its namespace selects it for that direction; then
//! only what some such policy's rules allow passes; a connection needs the sender's egress and
//! the receiver's ingress) applied to example pods in each namespace. It proves, per overlay:
//! a sandbox reaches latchkey's serving ports and nothing else at all (every TCP and UDP port
//! of latchkey, kube-dns, Redis, other pods, public and private addresses), an unlabelled pod in
//! the sandbox namespace reaches nothing, nothing reaches a sandbox; the admin port answers the
//! operator namespace only; latchkey reaches kube-dns and public addresses (not private ones)
//! and, in `ha`, Redis — which accepts latchkey and no one else.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use serde_yaml_ng::{Mapping, Value};

use super::super::{mapping, strings, text};
use super::{container_ports, documents, protocol, rendered, OVERLAYS, SANDBOX_EXAMPLE};

/// A pod (namespace, labels, address) or an address outside the cluster.
#[derive(Clone, Debug)]
struct Endpoint {
    pod: Option<(String, Mapping)>,
    ip: Ipv4Addr,
}

fn pod(namespace: &str, labels: &Value, ip: [u8; 4]) -> Endpoint {
    Endpoint {
        pod: Some((namespace.to_string(), mapping(labels))),
        ip: Ipv4Addr::from(ip),
    }
}

fn outside(ip: [u8; 4]) -> Endpoint {
    Endpoint {
        pod: None,
        ip: Ipv4Addr::from(ip),
    }
}

fn labels(pairs: &[(&str, &str)]) -> Value {
    Value::Mapping(
        pairs
            .iter()
            .map(|(k, v)| (Value::from(*k), Value::from(*v)))
            .collect(),
    )
}

/// A label selector (`matchLabels` only; `{}` selects everything).
fn matches(selector: &Value, labels: &Mapping) -> bool {
    assert!(
        selector.get("matchExpressions").is_none(),
        "this model reads matchLabels only: {selector:?}"
    );
    mapping(&selector["matchLabels"])
        .iter()
        .all(|(k, v)| labels.get(k) == Some(v))
}

fn in_cidr(ip: Ipv4Addr, cidr: &str) -> bool {
    let Some((net, len)) = cidr.split_once('/') else {
        panic!("not a CIDR: {cidr}")
    };
    let (Ok(net), Ok(len)) = (net.parse::<Ipv4Addr>(), len.parse::<u32>()) else {
        return false; // IPv6: the example endpoints are IPv4
    };
    let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
    u32::from(ip) & mask == u32::from(net) & mask
}

struct Model {
    policies: Vec<Value>,
    /// Namespace name → its labels (the rendered ones; any other has only its name label).
    namespaces: Vec<(String, Mapping)>,
}

impl Model {
    fn new(docs: &[Value]) -> Model {
        let of = |kind: &str| -> Vec<&Value> {
            docs.iter().filter(|d| text(&d["kind"]) == kind).collect()
        };
        let namespaces: Vec<(String, Mapping)> = of("Namespace")
            .into_iter()
            .map(|n| {
                (
                    text(&n["metadata"]["name"]),
                    mapping(&n["metadata"]["labels"]),
                )
            })
            .collect();
        let policies: Vec<Value> = of("NetworkPolicy").into_iter().cloned().collect();
        for p in &policies {
            let ns = text(&p["metadata"]["namespace"]);
            assert!(
                namespaces.iter().any(|(n, _)| *n == ns),
                "NetworkPolicy {} is in {ns:?}, which the manifests do not create",
                text(&p["metadata"]["name"])
            );
        }
        Model {
            policies,
            namespaces,
        }
    }

    fn namespace_labels(&self, name: &str) -> Mapping {
        self.namespaces
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, l)| l.clone())
            .unwrap_or_else(|| mapping(&labels(&[("kubernetes.io/metadata.name", name)])))
    }

    fn peer_matches(&self, peer: &Value, policy_ns: &str, other: &Endpoint) -> bool {
        if let Some(block) = peer.get("ipBlock") {
            return in_cidr(other.ip, &text(&block["cidr"]))
                && !strings(&block["except"])
                    .iter()
                    .any(|c| in_cidr(other.ip, c));
        }
        let Some((ns, pod_labels)) = &other.pod else {
            return false;
        };
        let ns_ok = match peer.get("namespaceSelector") {
            Some(sel) => matches(sel, &self.namespace_labels(ns)),
            None => ns == policy_ns,
        };
        ns_ok
            && peer
                .get("podSelector")
                .is_none_or(|sel| matches(sel, pod_labels))
    }

    /// Whether `at`'s policies let it send to (`Egress`) or accept from (`Ingress`) `other` on
    /// `port`/`proto` (the port at the receiving pod).
    fn allows(
        &self,
        at: &Endpoint,
        direction: &str,
        other: &Endpoint,
        port: u16,
        proto: &str,
    ) -> bool {
        let Some((ns, pod_labels)) = &at.pod else {
            return true; // outside the cluster: no policy of ours
        };
        let (rules_key, peers_key) = match direction {
            "Egress" => ("egress", "to"),
            _ => ("ingress", "from"),
        };
        let applicable: Vec<&Value> = self
            .policies
            .iter()
            .filter(|p| text(&p["metadata"]["namespace"]) == *ns)
            .filter(|p| matches(&p["spec"]["podSelector"], pod_labels))
            .filter(|p| {
                let types = strings(&p["spec"]["policyTypes"]);
                types.iter().any(|t| t == direction)
                    || (types.is_empty()
                        && (direction == "Ingress" || p["spec"].get("egress").is_some()))
            })
            .collect();
        if applicable.is_empty() {
            return true;
        }
        applicable.iter().any(|p| {
            let policy_ns = text(&p["metadata"]["namespace"]);
            p["spec"][rules_key].as_sequence().is_some_and(|rules| {
                rules.iter().any(|rule| {
                    let peers = rule[peers_key].as_sequence().cloned().unwrap_or_default();
                    let ports = rule["ports"].as_sequence().cloned().unwrap_or_default();
                    (peers.is_empty()
                        || peers
                            .iter()
                            .any(|peer| self.peer_matches(peer, &policy_ns, other)))
                        && (ports.is_empty()
                            || ports.iter().any(|p| {
                                assert!(p.get("endPort").is_none(), "endPort: not modelled");
                                let number = text(&p["port"]);
                                assert!(
                                    number.parse::<u16>().is_ok() || number.is_empty(),
                                    "named port {number}: not modelled"
                                );
                                protocol(p) == proto
                                    && (number.is_empty() || number == port.to_string())
                            }))
                })
            })
        })
    }

    /// Whether `from` may open a connection to `to` on `port`/`proto`.
    fn connects(&self, from: &Endpoint, to: &Endpoint, port: u16, proto: &str) -> bool {
        self.allows(from, "Egress", to, port, proto)
            && self.allows(to, "Ingress", from, port, proto)
    }

    /// Every (port, protocol) on which `from` reaches `to`.
    fn reachable(&self, from: &Endpoint, to: &Endpoint) -> BTreeSet<(u16, String)> {
        let mut open = BTreeSet::new();
        for proto in ["TCP", "UDP", "SCTP"] {
            for port in 1..=u16::MAX {
                if self.connects(from, to, port, proto) {
                    open.insert((port, proto.to_string()));
                }
            }
        }
        open
    }
}

/// The example pods of one overlay.
struct Pods {
    latchkey: Endpoint,
    redis: Option<Endpoint>,
    /// The sessions controller's pod, where the overlay has one.
    controller: Option<Endpoint>,
    sandbox: Endpoint,
    other_sandbox: Endpoint,
    unlabelled_sandbox: Endpoint,
    operator: Endpoint,
    elsewhere: Endpoint,
    latchkey_neighbour: Endpoint,
    kube_dns: Endpoint,
    /// latchkey's container ports: (serving ones, the admin one).
    serving: BTreeSet<(u16, String)>,
    admin: u16,
}

impl Pods {
    /// `list`, with Redis where the overlay has one.
    fn and_redis<'a>(
        &'a self,
        mut list: Vec<(&'a str, &'a Endpoint)>,
    ) -> Vec<(&'a str, &'a Endpoint)> {
        list.extend(self.redis.iter().map(|r| ("Redis", r)));
        list
    }
}

fn pods(docs: &[Value]) -> Pods {
    let deployment = |name: &str| {
        docs.iter()
            .find(|d| text(&d["kind"]) == "Deployment" && text(&d["metadata"]["name"]) == name)
            .cloned()
    };
    let lk = deployment("latchkey").expect("latchkey's Deployment");
    let lk_labels = &lk["spec"]["template"]["metadata"]["labels"];
    let lk_ns = text(&lk["metadata"]["namespace"]);
    let example = &documents(SANDBOX_EXAMPLE)[0];
    let sandbox_ns = text(&example["metadata"]["namespace"]);
    let sandbox_labels = &example["metadata"]["labels"];
    let ports = container_ports(&lk["spec"]["template"]["spec"]["containers"][0]);
    let admin: u16 = ports["admin"].0.parse().expect("the admin port");
    let serving = ports
        .values()
        .map(|(n, proto)| (n.parse::<u16>().expect("a port number"), proto.clone()))
        .filter(|(n, _)| *n != admin)
        .collect();
    let pod_of = |d: Value, ip| {
        pod(
            &text(&d["metadata"]["namespace"]),
            &d["spec"]["template"]["metadata"]["labels"],
            ip,
        )
    };
    Pods {
        controller: deployment("latchkey-sessions").map(|d| pod_of(d, [10, 244, 3, 20])),
        redis: deployment("latchkey-redis").map(|d| pod_of(d, [10, 244, 1, 20])),
        latchkey: pod(&lk_ns, lk_labels, [10, 244, 1, 10]),
        sandbox: pod(&sandbox_ns, sandbox_labels, [10, 244, 2, 10]),
        other_sandbox: pod(&sandbox_ns, sandbox_labels, [10, 244, 2, 11]),
        unlabelled_sandbox: pod(&sandbox_ns, &labels(&[("app", "build")]), [10, 244, 2, 12]),
        operator: pod(
            "latchkey-operators",
            &labels(&[("app", "console")]),
            [10, 244, 3, 10],
        ),
        elsewhere: pod("default", &labels(&[("app", "web")]), [10, 244, 4, 10]),
        latchkey_neighbour: pod(&lk_ns, &labels(&[("app", "debug")]), [10, 244, 1, 30]),
        kube_dns: pod(
            "kube-system",
            &labels(&[("k8s-app", "kube-dns")]),
            [10, 244, 0, 10],
        ),
        serving,
        admin,
    }
}

const PUBLIC: [u8; 4] = [93, 184, 216, 34];
const PRIVATE: [u8; 4] = [10, 0, 0, 5];
const METADATA: [u8; 4] = [169, 254, 169, 254];

#[test]
fn sandboxes_reach_latchkeys_serving_ports_and_nothing_else() {
    for overlay in OVERLAYS {
        let docs = rendered(overlay);
        let model = Model::new(docs);
        let p = pods(docs);
        let mut problems = Vec::new();
        let open = model.reachable(&p.sandbox, &p.latchkey);
        if open != p.serving {
            problems.push(format!(
                "a sandbox reaches latchkey on {open:?}, its serving ports are {:?}",
                p.serving
            ));
        }
        let closed = p.and_redis(vec![
            ("kube-dns", &p.kube_dns),
            ("another sandbox", &p.other_sandbox),
            ("a pod elsewhere", &p.elsewhere),
            ("an operator's pod", &p.operator),
        ]);
        let addresses = [outside(PUBLIC), outside(PRIVATE), outside(METADATA)];
        for (what, to) in closed
            .into_iter()
            .chain(addresses.iter().map(|a| ("an address", a)))
        {
            let open = model.reachable(&p.sandbox, to);
            if !open.is_empty() {
                problems.push(format!("a sandbox reaches {what} {}: {open:?}", to.ip));
            }
        }
        for to in [&p.latchkey, &p.kube_dns, &addresses[0]] {
            let open = model.reachable(&p.unlabelled_sandbox, to);
            if !open.is_empty() {
                problems.push(format!(
                    "an unlabelled pod in the sandbox namespace reaches {}: {open:?}",
                    to.ip
                ));
            }
        }
        for from in [&p.latchkey, &p.operator, &p.elsewhere, &p.other_sandbox] {
            let open = model.reachable(from, &p.sandbox);
            if !open.is_empty() {
                problems.push(format!("{} reaches a sandbox: {open:?}", from.ip));
            }
        }
        assert!(problems.is_empty(), "{overlay}:\n{}", problems.join("\n"));
    }
}

#[test]
fn the_admin_port_answers_the_operator_namespace_only() {
    for overlay in OVERLAYS {
        let docs = rendered(overlay);
        let model = Model::new(docs);
        let p = pods(docs);
        assert!(
            model.connects(&p.operator, &p.latchkey, p.admin, "TCP"),
            "{overlay}: the operator namespace cannot reach the admin API"
        );
        if let Some(controller) = &p.controller {
            assert!(
                model.connects(controller, &p.latchkey, p.admin, "TCP"),
                "{overlay}: the sessions controller cannot reach the admin API"
            );
            let open = model.reachable(&p.sandbox, controller);
            assert!(
                open.is_empty(),
                "{overlay}: a sandbox reaches the controller: {open:?}"
            );
        }
        let from = p.and_redis(vec![
            ("a sandbox", &p.sandbox),
            ("a pod elsewhere", &p.elsewhere),
            ("another pod in latchkey's namespace", &p.latchkey_neighbour),
            ("kube-dns", &p.kube_dns),
        ]);
        for (what, pod) in from {
            assert!(
                !model.connects(pod, &p.latchkey, p.admin, "TCP"),
                "{overlay}: {what} reaches the admin API"
            );
        }
    }
}

#[test]
fn latchkey_reaches_kube_dns_public_addresses_and_in_ha_redis_which_accepts_nothing_else() {
    for overlay in OVERLAYS {
        let docs = rendered(overlay);
        let model = Model::new(docs);
        let p = pods(docs);
        let lk = &p.latchkey;
        for proto in ["UDP", "TCP"] {
            assert!(
                model.connects(lk, &p.kube_dns, 53, proto),
                "{overlay}: latchkey to kube-dns 53/{proto}"
            );
        }
        assert!(
            model.connects(lk, &outside(PUBLIC), 443, "TCP"),
            "{overlay}: latchkey to a public address"
        );
        for (what, to) in [
            ("a private address", outside(PRIVATE)),
            ("cloud metadata", outside(METADATA)),
        ] {
            assert!(
                !model.connects(lk, &to, 443, "TCP") && !model.connects(lk, &to, 80, "TCP"),
                "{overlay}: latchkey reaches {what}"
            );
        }
        match (&p.redis, *overlay) {
            (None, "single") => {}
            (Some(redis), "ha" | "sessions-controller") => {
                assert_eq!(
                    model.reachable(lk, redis),
                    BTreeSet::from([(6379, "TCP".to_string())]),
                    "ha: latchkey reaches Redis on 6379 only"
                );
                for (what, from) in [
                    ("a sandbox", &p.sandbox),
                    ("an operator's pod", &p.operator),
                    ("another pod in latchkey's namespace", &p.latchkey_neighbour),
                    ("a pod elsewhere", &p.elsewhere),
                ] {
                    assert!(
                        model.reachable(from, redis).is_empty(),
                        "ha: {what} reaches Redis"
                    );
                }
                for to in [outside(PUBLIC), outside(PRIVATE)] {
                    assert!(
                        model.reachable(redis, &to).is_empty(),
                        "ha: Redis reaches {}",
                        to.ip
                    );
                }
            }
            (redis, _) => panic!("{overlay}: Redis is {redis:?}"),
        }
    }
}
