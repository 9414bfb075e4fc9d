//! `deploy/kubernetes/`, rendered: each overlay (`single`, `ha`, `sessions-controller`) through
//! `kubectl kustomize`, then checked — every object against the Kubernetes schemas in
//! [`validate`], the NetworkPolicies by evaluating them in [`netpol`], and here: selectors match
//! the labels they mean, every pod is hardened (non-root, read-only root, no capabilities,
//! RuntimeDefault seccomp, a service-account token only where a binding uses it, requests and
//! limits), latchkey's image is the one `images:` names, its flags and variables are real, the
//! CA comes from a Secret and the policies from a ConfigMap directory `latchkey check` accepts,
//! probes ask the admin port, the Services map the standard ports onto latchkey's listeners and
//! the admin port apart, the example sandbox resolves through the Service with the variables
//! `latchkey env` renders; `single` runs one replica on SQLite on a PersistentVolumeClaim,
//! replaced with `Recreate`; `ha` runs two or more sharing a Redis the manifests define, with a
//! PodDisruptionBudget and topology spread; the sessions controller runs the book's script with
//! the admin token latchkey reads.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;
use std::time::Duration;

use serde::Deserialize;
use serde_yaml_ng::Value;

use super::{
    check_sandbox_env, check_serve_flags, documents, env_rendered, flag_value, help_of, mapping,
    port_of, repo, selects, strings, text,
};
use crate::support::latchkey::wait_with_timeout;
use crate::support::run_cli;
use crate::support::toolchain::tool;

mod netpol;
mod validate;

/// The overlays users apply.
pub(super) const OVERLAYS: &[&str] = &["single", "ha", "sessions-controller"];

/// The example sandbox pod, applied on its own beside an overlay.
const SANDBOX_EXAMPLE: &str = "deploy/kubernetes/sandbox-example.yaml";

/// `kubectl kustomize deploy/kubernetes/overlays/NAME`'s objects, rendered once per process.
fn rendered(overlay: &str) -> &'static [Value] {
    static RENDERED: OnceLock<BTreeMap<&'static str, Vec<Value>>> = OnceLock::new();
    RENDERED.get_or_init(|| OVERLAYS.iter().map(|name| (*name, render(name))).collect())[overlay]
        .as_slice()
}

fn render(overlay: &str) -> Vec<Value> {
    let kubectl = tool("kubectl");
    let dir = repo().join("deploy/kubernetes/overlays").join(overlay);
    let mut cmd = std::process::Command::new(kubectl);
    cmd.arg("kustomize").arg(&dir);
    let out = wait_with_timeout(&mut cmd, Duration::from_secs(60));
    assert_eq!(
        out.code(),
        Some(0),
        "kubectl kustomize {} (needs kustomize v5: kubectl 1.27 or later; `kubectl version \
         --client` says which): {}",
        dir.display(),
        out.stderr
    );
    let docs: Vec<Value> = serde_yaml_ng::Deserializer::from_str(&out.stdout)
        .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("{overlay}: {e}")))
        .filter(|v| !v.is_null())
        .collect();
    for doc in &docs {
        assert!(
            doc["apiVersion"].is_string()
                && doc["kind"].is_string()
                && doc["metadata"]["name"].is_string(),
            "{overlay}: an object without apiVersion, kind and metadata.name: {doc:?}"
        );
    }
    assert!(docs.len() >= 10, "{overlay}: only {} objects", docs.len());
    docs
}

/// Every object users apply: each overlay's, and the example sandbox.
pub(super) fn manifests() -> Vec<(String, Value)> {
    let mut all: Vec<(String, Value)> = OVERLAYS
        .iter()
        .flat_map(|o| {
            rendered(o)
                .iter()
                .map(move |d| (format!("overlays/{o}"), d.clone()))
        })
        .collect();
    all.extend(
        documents(SANDBOX_EXAMPLE)
            .into_iter()
            .map(|d| (SANDBOX_EXAMPLE.to_string(), d)),
    );
    all
}

fn protocol(port: &Value) -> String {
    port.get("protocol")
        .map(text)
        .unwrap_or_else(|| "TCP".into())
}

/// A container's ports by name: (number, protocol).
fn container_ports(container: &Value) -> BTreeMap<String, (String, String)> {
    container["ports"]
        .as_sequence()
        .map(|s| {
            s.iter()
                .map(|p| (text(&p["name"]), (text(&p["containerPort"]), protocol(p))))
                .collect()
        })
        .unwrap_or_default()
}

/// A container's `env` as name → value (`valueFrom` ones as "").
fn env_of(container: &Value) -> BTreeMap<String, String> {
    container["env"]
        .as_sequence()
        .map(|e| {
            e.iter()
                .map(|v| (text(&v["name"]), text(&v["value"])))
                .collect()
        })
        .unwrap_or_default()
}

/// One overlay's objects, the example sandbox, and what the tests read from latchkey's
/// Deployment.
struct Cluster {
    overlay: &'static str,
    docs: Vec<Value>,
    deployment: Value,
    /// latchkey's container's `args` (serve's flags).
    args: Vec<String>,
    /// Its ports by name: (number, protocol).
    container_ports: BTreeMap<String, (String, String)>,
}

impl Cluster {
    fn load(overlay: &'static str) -> Cluster {
        let docs = rendered(overlay).to_vec();
        let deployment = one(&docs, "Deployment", "latchkey").clone();
        let container = &deployment["spec"]["template"]["spec"]["containers"][0];
        Cluster {
            overlay,
            args: strings(&container["args"]),
            container_ports: container_ports(container),
            docs,
            deployment,
        }
    }

    fn one(&self, kind: &str, name: &str) -> &Value {
        one(&self.docs, kind, name)
    }

    fn kind(&self, kind: &str) -> Vec<&Value> {
        self.docs
            .iter()
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

    /// The port a listener flag binds.
    fn bound(&self, flag: &str) -> String {
        flag_value(&self.args, flag)
            .map(|v| port_of(&v).to_string())
            .unwrap_or_else(|| panic!("{}: the Deployment sets no {flag}", self.overlay))
    }

    /// A port as a number: a container port's name resolved.
    fn number(&self, port: &str) -> String {
        self.container_ports
            .get(port)
            .map_or(port.to_string(), |(n, _)| n.clone())
    }

    /// The Service's ports: (port, protocol) → the container port number it reaches.
    fn service_ports(&self, name: &str) -> BTreeMap<(String, String), String> {
        let service = self.one("Service", name);
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

    /// `--state`, from the flag or `LATCHKEY_STATE` (with `$(VAR)` references to earlier
    /// variables checked and left as written).
    fn state(&self) -> String {
        let env = self.container()["env"]
            .as_sequence()
            .cloned()
            .unwrap_or_default();
        let mut defined = BTreeSet::new();
        for var in &env {
            let value = text(&var["value"]);
            for reference in value.split("$(").skip(1) {
                let name = reference.split(')').next().unwrap_or_default();
                assert!(
                    defined.contains(name),
                    "{}: {} refers to $({name}), defined no earlier",
                    self.overlay,
                    text(&var["name"])
                );
            }
            defined.insert(text(&var["name"]));
        }
        let from_env = env_of(self.container()).get("LATCHKEY_STATE").cloned();
        match (flag_value(&self.args, "--state"), from_env) {
            (Some(flag), None) => flag,
            (None, Some(var)) => var,
            other => panic!(
                "{}: --state should be set once, by flag or variable: {other:?}",
                self.overlay
            ),
        }
    }
}

fn one<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    let found: Vec<&Value> = docs
        .iter()
        .filter(|d| text(&d["kind"]) == kind && text(&d["metadata"]["name"]) == name)
        .collect();
    assert_eq!(found.len(), 1, "exactly one {kind} {name}");
    found[0]
}

/// Whether a (Cluster)RoleBinding grants the service account `namespace/name` something.
fn bound_account(docs: &[Value], namespace: &str, name: &str) -> bool {
    docs.iter()
        .filter(|d| text(&d["kind"]).ends_with("RoleBinding"))
        .flat_map(|b| b["subjects"].as_sequence().cloned().unwrap_or_default())
        .any(|s| {
            text(&s["kind"]) == "ServiceAccount"
                && text(&s["name"]) == name
                && text(&s["namespace"]) == namespace
        })
}

/// What a hardened pod spec lacks (every container, init containers included). Its
/// service-account token is mounted only where a binding gives that account something to do.
fn hardening_problems(what: &str, spec: &Value, namespace: &str, docs: &[Value]) -> Vec<String> {
    let mut problems = Vec::new();
    let pod = &spec["securityContext"];
    let account = text(&spec["serviceAccountName"]);
    if spec["automountServiceAccountToken"] != Value::Bool(false)
        && (account.is_empty() || !bound_account(docs, namespace, &account))
    {
        problems.push(format!(
            "{what}: the token of a service account with no binding ({account:?}) is mounted"
        ));
    }
    if pod["runAsNonRoot"] != Value::Bool(true) || pod["runAsUser"].as_u64().unwrap_or(0) == 0 {
        problems.push(format!("{what}: not a numeric non-root user: {pod:?}"));
    }
    if text(&pod["seccompProfile"]["type"]) != "RuntimeDefault" {
        problems.push(format!("{what}: seccomp is not RuntimeDefault"));
    }
    let containers = ["initContainers", "containers"]
        .iter()
        .flat_map(|k| spec[*k].as_sequence().cloned().unwrap_or_default());
    for c in containers {
        let name = format!("{what} container {}", text(&c["name"]));
        let sc = &c["securityContext"];
        if sc["readOnlyRootFilesystem"] != Value::Bool(true) {
            problems.push(format!("{name}: the root filesystem is writable"));
        }
        if sc["allowPrivilegeEscalation"] != Value::Bool(false) {
            problems.push(format!("{name}: privilege escalation is allowed"));
        }
        if !strings(&sc["capabilities"]["drop"]).contains(&"ALL".to_string())
            || sc["capabilities"].get("add").is_some()
        {
            problems.push(format!("{name}: capabilities are not all dropped"));
        }
        if sc.get("privileged") == Some(&Value::Bool(true)) {
            problems.push(format!("{name}: privileged"));
        }
        for (kind, keys) in [
            ("requests", ["cpu", "memory"]),
            ("limits", ["cpu", "memory"]),
        ] {
            for key in keys {
                if text(&c["resources"][kind][key]).is_empty() {
                    problems.push(format!("{name}: no {kind}.{key}"));
                }
            }
        }
    }
    problems
}

#[test]
fn every_pod_is_hardened_and_latchkeys_image_is_named_in_one_place() {
    let base = &documents("deploy/kubernetes/base/kustomization.yaml")[0];
    let image = &base["images"][0];
    let want = format!("{}:{}", text(&image["newName"]), text(&image["newTag"]));
    let mut problems = Vec::new();
    for overlay in OVERLAYS {
        let k = Cluster::load(overlay);
        for d in k.kind("Deployment") {
            let spec = &d["spec"]["template"]["spec"];
            let what = format!("{overlay}: Deployment {}", text(&d["metadata"]["name"]));
            let namespace = text(&d["metadata"]["namespace"]);
            problems.extend(hardening_problems(&what, spec, &namespace, &k.docs));
            if !selects(
                &d["spec"]["selector"]["matchLabels"],
                &d["spec"]["template"]["metadata"]["labels"],
            ) {
                problems.push(format!("{what}: its selector misses its pods"));
            }
            // A pod that serves something says when it is ready and alive (the sessions
            // controller serves nothing: a watch loop that starts over by itself).
            let serves = spec["containers"][0].get("ports").is_some();
            for probe in ["readinessProbe", "livenessProbe"] {
                if serves && spec["containers"][0].get(probe).is_none() {
                    problems.push(format!("{what}: no {probe}"));
                }
            }
        }
        let image = text(&k.container()["image"]);
        if image != want {
            problems.push(format!(
                "{overlay}: latchkey's image is {image}, `images:` says {want}"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    let raw = &documents("deploy/kubernetes/base/deployment.yaml")[0];
    assert_eq!(
        text(&raw["spec"]["template"]["spec"]["containers"][0]["image"]),
        text(&image["name"]),
        "deployment.yaml names the image only by the name `images:` replaces"
    );
}

#[test]
fn latchkey_runs_with_the_ca_secret_the_policy_configmap_real_flags_and_admin_probes() {
    let (serve_flags, serve_vars) = help_of("serve");
    for overlay in OVERLAYS {
        let k = Cluster::load(overlay);
        let spec = k.pod_spec();
        let container = k.container();
        let mut problems = check_serve_flags(overlay, &k.args, &serve_flags);
        for name in env_of(container).keys() {
            if name.starts_with("LATCHKEY_") && !serve_vars.contains(name) {
                problems.push(format!(
                    "{overlay}: `latchkey serve` reads no variable {name}"
                ));
            }
        }
        assert!(problems.is_empty(), "{}", problems.join("\n"));

        let volume_at = |path: &str| -> (Value, Value) {
            let mount = container["volumeMounts"]
                .as_sequence()
                .and_then(|m| m.iter().find(|m| text(&m["mountPath"]) == path))
                .unwrap_or_else(|| panic!("{overlay}: nothing is mounted at {path}"))
                .clone();
            let volume = spec["volumes"]
                .as_sequence()
                .and_then(|v| v.iter().find(|v| v["name"] == mount["name"]))
                .unwrap_or_else(|| panic!("{overlay}: no volume {:?}", mount["name"]))
                .clone();
            (mount, volume)
        };
        let ca_dir = flag_value(&k.args, "--ca-dir").expect("the Deployment sets --ca-dir");
        let (mount, volume) = volume_at(&ca_dir);
        assert_eq!(mount["readOnly"], Value::Bool(true), "the CA is read-only");
        assert!(
            !text(&volume["secret"]["secretName"]).is_empty(),
            "{overlay}: the CA comes from a Secret: {volume:?}"
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
            "{overlay}: the ConfigMap's policy: {}{}",
            check.stdout,
            check.stderr
        );

        // Probes ask the admin API, whose address the kubelet can reach.
        let admin = flag_value(&k.args, "--admin").expect("the Deployment sets --admin");
        assert!(admin.starts_with("0.0.0.0:"), "--admin {admin}");
        for probe in ["readinessProbe", "livenessProbe"] {
            let port = text(&container[probe]["httpGet"]["port"]);
            assert_eq!(k.number(&port), k.bound("--admin"), "{probe} asks admin");
        }
        assert_eq!(
            text(&container["readinessProbe"]["httpGet"]["path"]),
            "/readyz"
        );
        assert_eq!(
            text(&container["livenessProbe"]["httpGet"]["path"]),
            "/healthz"
        );
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
                "{overlay}: {flag} binds {port}, which the container does not declare"
            );
        }
    }
}

#[test]
fn the_services_map_the_standard_ports_onto_latchkeys_listeners_and_admin_apart() {
    for overlay in OVERLAYS {
        let k = Cluster::load(overlay);
        let service = k.one("Service", "latchkey");
        assert!(selects(&service["spec"]["selector"], k.labels()));
        assert_eq!(
            flag_value(&k.args, "--dns-self"),
            Some(text(&service["spec"]["clusterIP"])),
            "the resolver answers with the Service's address"
        );
        let mapped = k.service_ports("latchkey");
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
                    "{overlay}: Service {port}/{proto} reaches {:?}, {flag} binds {}",
                    mapped.get(&key),
                    k.bound(flag)
                ));
            }
        }
        if mapped.values().any(|n| *n == k.bound("--admin")) {
            problems.push(format!("{overlay}: the Service exposes the admin port"));
        }
        // The admin API has a Service of its own, with nothing else on it.
        let admin = k.one("Service", "latchkey-admin");
        assert!(selects(&admin["spec"]["selector"], k.labels()));
        let admin_ports: Vec<String> = k.service_ports("latchkey-admin").into_values().collect();
        if admin_ports != [k.bound("--admin")] {
            problems.push(format!("{overlay}: latchkey-admin reaches {admin_ports:?}"));
        }
        assert!(problems.is_empty(), "{}", problems.join("\n"));
    }
}

#[test]
fn single_runs_one_replica_on_sqlite_on_a_persistent_volume_replaced_with_recreate() {
    let k = Cluster::load("single");
    assert_eq!(k.deployment["spec"]["replicas"].as_u64(), Some(1));
    assert_eq!(
        text(&k.deployment["spec"]["strategy"]["type"]),
        "Recreate",
        "a rolling update would start a second serve on the locked SQLite file"
    );
    let state = k.state();
    let path = state
        .strip_prefix("sqlite:")
        .unwrap_or_else(|| panic!("--state={state}: not SQLite"));
    let mount = k.container()["volumeMounts"]
        .as_sequence()
        .and_then(|m| {
            m.iter()
                .find(|m| path.starts_with(&format!("{}/", text(&m["mountPath"]))))
        })
        .unwrap_or_else(|| panic!("{path} is on no mounted volume (the root is read-only)"));
    assert_ne!(mount["readOnly"], Value::Bool(true));
    let volume = k.pod_spec()["volumes"]
        .as_sequence()
        .and_then(|v| v.iter().find(|v| v["name"] == mount["name"]))
        .expect("the state volume");
    let claim = text(&volume["persistentVolumeClaim"]["claimName"]);
    let pvc = k.one("PersistentVolumeClaim", &claim);
    assert_eq!(
        pvc["metadata"]["namespace"],
        k.deployment["metadata"]["namespace"]
    );
    assert!(strings(&pvc["spec"]["accessModes"]).contains(&"ReadWriteOnce".to_string()));
    assert!(
        k.kind("PodDisruptionBudget").is_empty(),
        "a PDB of one pod blocks drains"
    );
}

#[test]
fn ha_runs_spread_replicas_sharing_the_redis_it_defines_under_a_disruption_budget() {
    for overlay in ["ha", "sessions-controller"] {
        ha_checks(overlay);
    }
}

fn ha_checks(overlay: &'static str) {
    let k = Cluster::load(overlay);
    let replicas = k.deployment["spec"]["replicas"].as_u64().unwrap_or(0);
    assert!(replicas >= 2, "replicas: {replicas}");

    // The budget covers latchkey's pods and lets a drain proceed one pod at a time.
    let pdb = k.one("PodDisruptionBudget", "latchkey");
    assert!(selects(&pdb["spec"]["selector"]["matchLabels"], k.labels()));
    assert_eq!(
        pdb["metadata"]["namespace"],
        k.deployment["metadata"]["namespace"]
    );
    let spec = &pdb["spec"];
    let allows = match (
        spec["maxUnavailable"].as_u64(),
        spec["minAvailable"].as_u64(),
    ) {
        (Some(max), None) => max,
        (None, Some(min)) => replicas.saturating_sub(min),
        other => panic!("the PDB sets one of maxUnavailable, minAvailable: {other:?}"),
    };
    assert!(
        allows >= 1 && allows < replicas,
        "the PDB lets {allows} of {replicas} go"
    );

    // Spread over nodes and zones, each constraint counting latchkey's pods.
    let spread = k.pod_spec()["topologySpreadConstraints"]
        .as_sequence()
        .cloned()
        .unwrap_or_default();
    let keys: BTreeSet<String> = spread
        .iter()
        .filter(|c| selects(&c["labelSelector"]["matchLabels"], k.labels()))
        .map(|c| text(&c["topologyKey"]))
        .collect();
    for key in ["kubernetes.io/hostname", "topology.kubernetes.io/zone"] {
        assert!(keys.contains(key), "no spread over {key}: {spread:?}");
    }

    // The state store: a Redis URL whose host is a Service here, reaching a Redis pod's port.
    let state = k.state();
    let rest = state
        .strip_prefix("redis://")
        .unwrap_or_else(|| panic!("--state={state}: not Redis"));
    let host_port = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
    let host_port = host_port.split('/').next().unwrap_or_default();
    let (host, port) = host_port
        .rsplit_once(':')
        .unwrap_or_else(|| panic!("{state}: no port"));
    let mut labels = host.split('.');
    let (name, namespace) = (labels.next().unwrap_or_default(), labels.next());
    let service = k.one("Service", name);
    assert_eq!(
        namespace.map(str::to_string),
        Some(text(&service["metadata"]["namespace"])),
        "{host} names the Service's namespace"
    );
    let redis = k
        .kind("Deployment")
        .into_iter()
        .find(|d| {
            selects(
                &service["spec"]["selector"],
                &d["spec"]["template"]["metadata"]["labels"],
            )
        })
        .unwrap_or_else(|| panic!("the Service {name} selects no Deployment's pods"));
    let redis_ports = container_ports(&redis["spec"]["template"]["spec"]["containers"][0]);
    let target = service["spec"]["ports"]
        .as_sequence()
        .and_then(|ps| ps.iter().find(|p| text(&p["port"]) == port))
        .map(|p| text(&p["targetPort"]))
        .unwrap_or_else(|| panic!("the Service {name} has no port {port}"));
    let (number, _) = redis_ports
        .get(&target)
        .unwrap_or_else(|| panic!("Redis declares no port {target}"));
    assert_eq!(number, "6379");
    // That the NetworkPolicies let latchkey reach it (and nothing else): netpol.rs.
}

#[test]
fn the_example_sandbox_resolves_through_latchkey_with_what_latchkey_env_renders() {
    let k = Cluster::load("single");
    let service = k.one("Service", "latchkey");
    let cluster_ip = text(&service["spec"]["clusterIP"]);
    let docs = documents(SANDBOX_EXAMPLE);
    assert_eq!(docs.len(), 1, "one example sandbox Pod");
    let example = &docs[0];
    assert_eq!(text(&example["kind"]), "Pod");
    assert_eq!(text(&example["metadata"]["namespace"]), "sandbox");
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
    let proxy_port = k
        .service_ports("latchkey")
        .into_iter()
        .find(|((_, proto), target)| proto == "TCP" && *target == k.bound("--listen"))
        .map(|((port, _), _)| port)
        .expect("a Service port onto the proxy");
    let proxy = format!("http://{cluster_ip}:{proxy_port}");
    let problems = check_sandbox_env(
        "the example sandbox",
        &env_of(agent),
        &env_rendered(&proxy, &text(&trust["mountPath"])),
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_sessions_controller_runs_the_books_script_with_the_token_latchkey_reads() {
    let k = Cluster::load("sessions-controller");
    // The script is the book's, byte for byte.
    let book = super::read("docs/src/sessions.md");
    let script = book
        .split("```python\n")
        .find(|block| block.contains("latchkey-sessions: one latchkey session per sandbox pod"))
        .and_then(|block| block.split("```").next())
        .expect("docs/src/sessions.md's controller script");
    let controller = k.one("Deployment", "latchkey-sessions");
    let spec = &controller["spec"]["template"]["spec"];
    let container = &spec["containers"][0];
    let mounted = |path: &str| -> Value {
        let mount = container["volumeMounts"]
            .as_sequence()
            .and_then(|ms| {
                ms.iter()
                    .find(|m| path.starts_with(&format!("{}/", text(&m["mountPath"]))))
            })
            .unwrap_or_else(|| panic!("the controller mounts nothing holding {path}"));
        spec["volumes"]
            .as_sequence()
            .and_then(|vs| vs.iter().find(|v| v["name"] == mount["name"]))
            .cloned()
            .unwrap_or_else(|| panic!("no volume {:?}", mount["name"]))
    };
    let command = strings(&container["command"]);
    let file = command.last().expect("the controller's command");
    let volume = mounted(file);
    let configmap = k.one("ConfigMap", &text(&volume["configMap"]["name"]));
    let name = file.rsplit('/').next().unwrap_or_default();
    assert_eq!(
        text(&configmap["data"][name]),
        script,
        "the ConfigMap's script differs from docs/src/sessions.md's"
    );

    // It calls the admin Service's admin port...
    let env = env_of(container);
    let url = &env["LATCHKEY_ADMIN_URL"];
    let rest = url.strip_prefix("http://").expect("an http:// admin URL");
    let (host, port) = rest.rsplit_once(':').expect("a port in the admin URL");
    let service = k.one("Service", "latchkey-admin");
    assert_eq!(
        host,
        format!(
            "latchkey-admin.{}.svc",
            text(&service["metadata"]["namespace"])
        )
    );
    let mapped = k.service_ports("latchkey-admin");
    assert_eq!(
        mapped.get(&(port.to_string(), "TCP".to_string())),
        Some(&k.bound("--admin"))
    );
    // ...with a token from the Secret latchkey reads at the path the policy names.
    let token_file = &env["LATCHKEY_ADMIN_TOKEN_FILE"];
    let secret = text(&mounted(token_file)["secret"]["secretName"]);
    let policies = k.one("ConfigMap", "latchkey-policies");
    let needle = format!("token  = \"file:{token_file}\"");
    assert!(
        mapping(&policies["data"])
            .values()
            .any(|body| text(body).contains(&needle)),
        "no admin token in the policy reads {token_file}"
    );
    let dir = token_file.rsplit_once('/').map_or("", |(d, _)| d);
    let latchkey_mount = k.container()["volumeMounts"]
        .as_sequence()
        .and_then(|ms| ms.iter().find(|m| text(&m["mountPath"]) == dir))
        .unwrap_or_else(|| panic!("latchkey mounts nothing at {dir}"));
    let latchkey_volume = k.pod_spec()["volumes"]
        .as_sequence()
        .and_then(|vs| vs.iter().find(|v| v["name"] == latchkey_mount["name"]))
        .expect("latchkey's admin-token volume");
    assert_eq!(text(&latchkey_volume["secret"]["secretName"]), secret);

    // Its account may read pods and nothing else.
    let account = text(&spec["serviceAccountName"]);
    assert!(bound_account(&k.docs, "latchkey-operators", &account));
    for role in k.kind("ClusterRole") {
        for rule in role["rules"].as_sequence().cloned().unwrap_or_default() {
            assert_eq!(strings(&rule["resources"]), ["pods"], "{rule:?}");
            assert_eq!(
                strings(&rule["verbs"]),
                ["get", "list", "watch"],
                "{rule:?}"
            );
        }
    }
}
