//! `deploy/kubernetes/*.yaml`, checked for structure: every document parses, selectors match
//! the labels they mean, the Deployment runs two unprivileged replicas with the CA from a Secret
//! and the policies from a ConfigMap directory (which `latchkey check` accepts), the Service maps
//! the standard ports onto latchkey's listeners, sandboxes may reach latchkey's serving ports
//! and nothing else (DNS included, the admin port not), and the example sandbox resolves through
//! the Service with the variables `latchkey env` renders.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use serde_yaml_ng::Value;

use super::{
    check_sandbox_env, check_serve_flags, documents, env_rendered, flag_value, help_of, mapping,
    port_of, repo, selects, strings, text,
};
use crate::support::run_cli;

/// Every document of every manifest, with its file.
pub(super) fn manifests() -> Vec<(String, Value)> {
    let dir = repo().join("deploy/kubernetes");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("deploy/kubernetes")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    files.sort();
    let mut out = Vec::new();
    for path in files {
        let rel = path
            .strip_prefix(repo())
            .expect("under the repo")
            .display()
            .to_string();
        for doc in documents(&rel) {
            assert!(
                doc["apiVersion"].is_string()
                    && doc["kind"].is_string()
                    && doc["metadata"]["name"].is_string(),
                "{rel}: a document without apiVersion, kind and metadata.name"
            );
            out.push((rel.clone(), doc));
        }
    }
    assert!(out.len() >= 8, "found only {} documents", out.len());
    out
}

/// `(port, protocol)` pairs of a port list (`protocol` defaults to TCP).
fn ports(list: &Value, key: &str) -> BTreeSet<(String, String)> {
    list.as_sequence()
        .map(|s| s.iter().map(|p| (text(&p[key]), protocol(p))).collect())
        .unwrap_or_default()
}

fn protocol(port: &Value) -> String {
    port.get("protocol")
        .map(text)
        .unwrap_or_else(|| "TCP".into())
}

/// The manifests, and what the tests read from latchkey's Deployment.
struct Cluster {
    docs: Vec<(String, Value)>,
    deployment: Value,
    /// latchkey's container's `args` (serve's flags).
    args: Vec<String>,
    /// Its ports by name: (number, protocol).
    container_ports: BTreeMap<String, (String, String)>,
}

impl Cluster {
    fn load() -> Cluster {
        let docs = manifests();
        let deployment = one(&docs, "Deployment", "latchkey").clone();
        let container = &deployment["spec"]["template"]["spec"]["containers"][0];
        let args = strings(&container["args"]);
        let container_ports = container["ports"]
            .as_sequence()
            .map(|s| {
                s.iter()
                    .map(|p| (text(&p["name"]), (text(&p["containerPort"]), protocol(p))))
                    .collect()
            })
            .unwrap_or_default();
        Cluster {
            docs,
            deployment,
            args,
            container_ports,
        }
    }

    fn one(&self, kind: &str, name: &str) -> &Value {
        one(&self.docs, kind, name)
    }

    fn kind(&self, kind: &str) -> Vec<&Value> {
        self.docs
            .iter()
            .map(|(_, d)| d)
            .filter(|d| text(&d["kind"]) == kind)
            .collect()
    }

    fn pod_spec(&self) -> &Value {
        &self.deployment["spec"]["template"]["spec"]
    }

    fn container(&self) -> &Value {
        &self.pod_spec()["containers"][0]
    }

    /// latchkey's pod labels.
    fn labels(&self) -> &Value {
        &self.deployment["spec"]["template"]["metadata"]["labels"]
    }

    /// The namespace latchkey runs in, as a document.
    fn namespace(&self) -> &Value {
        self.one(
            "Namespace",
            &text(&self.deployment["metadata"]["namespace"]),
        )
    }

    /// The port a listener flag binds.
    fn bound(&self, flag: &str) -> String {
        flag_value(&self.args, flag)
            .map(|v| port_of(&v).to_string())
            .unwrap_or_else(|| panic!("the Deployment sets no {flag}"))
    }

    /// A port as a number: a container port's name resolved.
    fn number(&self, port: &str) -> String {
        self.container_ports
            .get(port)
            .map_or(port.to_string(), |(n, _)| n.clone())
    }

    /// The NetworkPolicy selecting latchkey's pods (`true`) or the sandboxes (`false`).
    fn network_policy(&self, latchkeys: bool) -> &Value {
        let found: Vec<&Value> = self
            .kind("NetworkPolicy")
            .into_iter()
            .filter(|p| {
                selects(&p["spec"]["podSelector"]["matchLabels"], self.labels()) == latchkeys
            })
            .collect();
        assert_eq!(
            found.len(),
            1,
            "one NetworkPolicy (latchkey's: {latchkeys})"
        );
        found[0]
    }

    /// The Service's ports: (port, protocol) → the container port number it reaches.
    fn service_ports(&self) -> BTreeMap<(String, String), String> {
        let service = self.one("Service", "latchkey");
        let mut mapped = BTreeMap::new();
        for p in service["spec"]["ports"]
            .as_sequence()
            .cloned()
            .unwrap_or_default()
        {
            let target = text(&p["targetPort"]);
            if let Some((_, target_proto)) = self.container_ports.get(&target) {
                assert_eq!(&protocol(&p), target_proto, "Service port onto {target}");
            }
            mapped.insert((text(&p["port"]), protocol(&p)), self.number(&target));
        }
        mapped
    }
}

fn one<'a>(docs: &'a [(String, Value)], kind: &str, name: &str) -> &'a Value {
    let found: Vec<&Value> = docs
        .iter()
        .map(|(_, d)| d)
        .filter(|d| text(&d["kind"]) == kind && text(&d["metadata"]["name"]) == name)
        .collect();
    assert_eq!(found.len(), 1, "exactly one {kind} {name}");
    found[0]
}

#[test]
fn the_deployment_runs_unprivileged_replicas_with_the_ca_secret_and_the_policy_configmap() {
    let k = Cluster::load();
    let spec = k.pod_spec();
    let container = k.container();
    assert!(
        k.deployment["spec"]["replicas"].as_u64().unwrap_or(0) >= 2,
        "replicas >= 2"
    );
    assert!(selects(
        &k.deployment["spec"]["selector"]["matchLabels"],
        k.labels()
    ));
    assert_eq!(spec["securityContext"]["runAsNonRoot"], Value::Bool(true));
    assert!(spec["securityContext"]["runAsUser"].as_u64().unwrap_or(0) > 0);
    let sc = &container["securityContext"];
    assert_eq!(sc["readOnlyRootFilesystem"], Value::Bool(true));
    assert_eq!(sc["allowPrivilegeEscalation"], Value::Bool(false));
    assert!(strings(&sc["capabilities"]["drop"]).contains(&"ALL".to_string()));
    let (serve_flags, _) = help_of("serve");
    let problems = check_serve_flags("the Deployment", &k.args, &serve_flags);
    assert!(problems.is_empty(), "{}", problems.join("\n"));

    let volume_at = |path: &str| -> (Value, Value) {
        let mount = container["volumeMounts"]
            .as_sequence()
            .and_then(|m| m.iter().find(|m| text(&m["mountPath"]) == path))
            .unwrap_or_else(|| panic!("nothing is mounted at {path}"))
            .clone();
        let volume = spec["volumes"]
            .as_sequence()
            .and_then(|v| v.iter().find(|v| v["name"] == mount["name"]))
            .unwrap_or_else(|| panic!("no volume {:?}", mount["name"]))
            .clone();
        (mount, volume)
    };
    let ca_dir = flag_value(&k.args, "--ca-dir").expect("the Deployment sets --ca-dir");
    let (mount, volume) = volume_at(&ca_dir);
    assert_eq!(
        mount["readOnly"],
        Value::Bool(true),
        "the CA is mounted read-only"
    );
    assert!(
        !text(&volume["secret"]["secretName"]).is_empty(),
        "the CA comes from a Secret: {volume:?}"
    );
    let policies = flag_value(&k.args, "--policies").expect("the Deployment sets --policies");
    let (mount, volume) = volume_at(&policies);
    assert!(
        mount.get("subPath").is_none(),
        "a subPath mount never sees ConfigMap updates"
    );
    let configmap = k.one("ConfigMap", &text(&volume["configMap"]["name"]));
    let dir = tempfile::tempdir().expect("policy dir");
    for (file, body) in mapping(&configmap["data"]) {
        std::fs::write(dir.path().join(text(&file)), text(&body)).expect("write policy");
    }
    let check = run_cli([
        "check",
        "--no-secrets",
        "--policies",
        &dir.path().display().to_string(),
    ]);
    assert_eq!(
        check.code(),
        Some(0),
        "the ConfigMap's policy: {}{}",
        check.stdout,
        check.stderr
    );

    // Probes ask the admin API, whose address the kubelet can reach.
    let admin = flag_value(&k.args, "--admin").expect("the Deployment sets --admin");
    assert!(admin.starts_with("0.0.0.0:"), "--admin {admin}");
    for probe in ["readinessProbe", "livenessProbe"] {
        let port = text(&container[probe]["httpGet"]["port"]);
        assert_eq!(
            k.number(&port),
            k.bound("--admin"),
            "{probe} asks the admin port"
        );
    }
    assert_eq!(
        text(&container["readinessProbe"]["httpGet"]["path"]),
        "/readyz"
    );
    // Every listener flag binds a port the container declares.
    for flag in [
        "--listen",
        "--admin",
        "--dns",
        "--https-listen",
        "--http-listen",
        "--socks",
    ] {
        let port = k.bound(flag);
        assert!(
            k.container_ports.values().any(|(n, _)| *n == port),
            "{flag} binds {port}, which the container does not declare"
        );
    }
}

#[test]
fn the_service_maps_the_standard_ports_onto_latchkeys_listeners() {
    let k = Cluster::load();
    let service = k.one("Service", "latchkey");
    assert!(
        selects(&service["spec"]["selector"], k.labels()),
        "the Service selects latchkey's pods"
    );
    assert_eq!(
        flag_value(&k.args, "--dns-self"),
        Some(text(&service["spec"]["clusterIP"])),
        "the resolver answers with the Service's address"
    );
    let mapped = k.service_ports();
    let mut problems = Vec::new();
    for (port, proto, flag) in [
        ("53", "UDP", "--dns"),
        ("53", "TCP", "--dns"),
        ("443", "TCP", "--https-listen"),
        ("80", "TCP", "--http-listen"),
        ("3128", "TCP", "--listen"),
        ("1080", "TCP", "--socks"),
    ] {
        let key = (port.to_string(), proto.to_string());
        if mapped.get(&key) != Some(&k.bound(flag)) {
            problems.push(format!(
                "Service {port}/{proto} reaches {:?}, {flag} binds {}",
                mapped.get(&key),
                k.bound(flag)
            ));
        }
    }
    if mapped.values().any(|n| *n == k.bound("--admin")) {
        problems.push("the Service exposes the admin port".into());
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn sandboxes_may_reach_latchkeys_serving_ports_and_nothing_else() {
    let k = Cluster::load();
    let policy = k.network_policy(false);
    let admin = k.bound("--admin");
    assert_eq!(
        text(&policy["spec"]["podSelector"]["matchLabels"]["latchkey.dev/sandbox"]),
        "true"
    );
    let types = strings(&policy["spec"]["policyTypes"]);
    assert!(
        types.contains(&"Egress".into()) && types.contains(&"Ingress".into()),
        "{types:?}"
    );
    assert!(
        policy["spec"]["ingress"]
            .as_sequence()
            .is_none_or(|s| s.is_empty()),
        "nothing may connect to a sandbox"
    );
    let egress = policy["spec"]["egress"]
        .as_sequence()
        .cloned()
        .unwrap_or_default();
    assert!(!egress.is_empty(), "the sandboxes may reach latchkey");
    let mut allowed = BTreeSet::new();
    let mut problems = Vec::new();
    for rule in &egress {
        let to = rule["to"].as_sequence().cloned().unwrap_or_default();
        if to.is_empty() {
            problems.push(format!(
                "an egress rule without `to` allows every destination: {rule:?}"
            ));
        }
        for peer in &to {
            let latchkeys = peer.get("ipBlock").is_none()
                && selects(&peer["podSelector"]["matchLabels"], k.labels())
                && selects(
                    &peer["namespaceSelector"]["matchLabels"],
                    &k.namespace()["metadata"]["labels"],
                );
            if !latchkeys {
                problems.push(format!(
                    "a destination other than latchkey's pods: {peer:?}"
                ));
            }
        }
        let rule_ports = ports(&rule["ports"], "port");
        if rule_ports.is_empty() {
            problems.push("an egress rule without ports opens every port".into());
        }
        allowed.extend(rule_ports);
    }
    if allowed.iter().any(|(p, _)| *p == admin) {
        problems.push("the sandboxes may reach latchkey's admin port".into());
    }
    let dns = k.bound("--dns");
    for want in [
        (dns.clone(), "UDP".to_string()),
        (dns, "TCP".to_string()),
        (k.bound("--listen"), "TCP".to_string()),
        (k.bound("--https-listen"), "TCP".to_string()),
        (k.bound("--http-listen"), "TCP".to_string()),
    ] {
        if !allowed.contains(&want) {
            problems.push(format!("the sandboxes may not reach latchkey's {want:?}"));
        }
    }
    for (port, proto) in &allowed {
        if !k
            .container_ports
            .values()
            .any(|(p, pr)| p == port && pr == proto)
        {
            problems.push(format!(
                "sandbox egress opens {port}/{proto}, which latchkey does not serve"
            ));
        }
    }

    // latchkey's own policy: sandboxes in on the serving ports (never admin), latchkey out.
    let own = k.network_policy(true);
    let ingress: BTreeSet<(String, String)> = own["spec"]["ingress"]
        .as_sequence()
        .map(|rules| {
            rules
                .iter()
                .flat_map(|r| ports(&r["ports"], "port"))
                .collect()
        })
        .unwrap_or_default();
    if ingress.iter().any(|(p, _)| *p == admin) {
        problems.push("latchkey's ingress opens the admin port".into());
    }
    if !ingress.is_superset(&allowed) {
        problems.push(format!(
            "latchkey's ingress {ingress:?} does not admit what the sandboxes may send {allowed:?}"
        ));
    }
    let own_egress = own["spec"]["egress"]
        .as_sequence()
        .cloned()
        .unwrap_or_default();
    if !strings(&own["spec"]["policyTypes"]).contains(&"Egress".into()) || own_egress.is_empty() {
        problems.push("latchkey's own egress is not allowed".into());
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_example_sandbox_resolves_through_latchkey_with_what_latchkey_env_renders() {
    let k = Cluster::load();
    let policy = k.network_policy(false);
    let service = k.one("Service", "latchkey");
    let cluster_ip = text(&service["spec"]["clusterIP"]);
    let pods = k.kind("Pod");
    assert_eq!(pods.len(), 1, "one example sandbox Pod");
    let example = pods[0];
    assert_eq!(
        example["metadata"]["namespace"],
        policy["metadata"]["namespace"]
    );
    assert!(
        selects(
            &policy["spec"]["podSelector"]["matchLabels"],
            &example["metadata"]["labels"]
        ),
        "the sandbox NetworkPolicy selects the example"
    );
    assert_eq!(text(&example["spec"]["dnsPolicy"]), "None");
    assert_eq!(
        strings(&example["spec"]["dnsConfig"]["nameservers"]),
        vec![cluster_ip.clone()]
    );
    assert_eq!(
        example["spec"]["automountServiceAccountToken"],
        Value::Bool(false)
    );
    let agent = &example["spec"]["containers"][0];
    let trust = &agent["volumeMounts"][0];
    assert_eq!(trust["readOnly"], Value::Bool(true));
    let volume = &example["spec"]["volumes"][0];
    assert_eq!(volume["name"], trust["name"]);
    assert!(
        volume.get("secret").is_none() && !text(&volume["configMap"]["name"]).is_empty(),
        "the sandbox's trust is a ConfigMap (certificates), never the CA's Secret"
    );
    let env: BTreeMap<String, String> = agent["env"]
        .as_sequence()
        .map(|e| {
            e.iter()
                .map(|v| (text(&v["name"]), text(&v["value"])))
                .collect()
        })
        .unwrap_or_default();
    let proxy_port = k
        .service_ports()
        .into_iter()
        .find(|((_, proto), target)| proto == "TCP" && *target == k.bound("--listen"))
        .map(|((port, _), _)| port)
        .expect("a Service port onto the proxy");
    let proxy = format!("http://{cluster_ip}:{proxy_port}");
    let problems = check_sandbox_env(
        "the example sandbox",
        &env,
        &env_rendered(&proxy, &text(&trust["mountPath"])),
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
