#!/usr/bin/env python3
"""latchkey-sessions: one latchkey session per sandbox pod, bound to the pod's IP.

Watches pods labelled latchkey.dev/sandbox=true. When one has an IP, makes a session of the
profile its namespace maps to (source = the pod IP, labels from the pod); when the pod ends or
is deleted, revokes it. Each (re)start of the watch first revokes the sessions of pods that
vanished while nobody watched. Needs: pip install kubernetes; a service account that may get,
list and watch pods; a latchkey admin token with sessions:write and read.
"""
import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request

from kubernetes import client, config, watch

ADMIN = os.environ.get("LATCHKEY_ADMIN_URL", "http://latchkey-admin.latchkey.svc:3129")
with open(os.environ.get("LATCHKEY_ADMIN_TOKEN_FILE", "/var/run/latchkey/admin/controller")) as f:
    TOKEN = f.read().strip()
# Which profile a namespace's sandboxes get: the platform's decision, not the pod's.
PROFILES = json.loads(os.environ.get("PROFILES", '{"sandbox": "coding-agent"}'))
SELECTOR = "latchkey.dev/sandbox=true"
MANAGER = "latchkey-sessions"


def admin(method, path, body=None):
    req = urllib.request.Request(
        ADMIN + path, method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"authorization": f"Bearer {TOKEN}", "content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as res:
            text = res.read()
            return res.status, json.loads(text) if text else {}
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def sessions(label, value, state=None):
    query = {"label": f"{label}={value}", "limit": 10000}
    if state:
        query["state"] = state
    status, body = admin("GET", "/sessions?" + urllib.parse.urlencode(query))
    if status != 200:
        raise RuntimeError(f"GET /sessions: {status} {body}")
    return body["sessions"]


def revoke(session, why):
    status, body = admin("DELETE", f"/sessions/{session['id']}")
    print(f"revoke {session['id']} ({why}): {status} {body.get('error', '')}", flush=True)


def pod_exists(v1, labels):
    try:
        pod = v1.read_namespaced_pod(labels["pod"], labels["namespace"])
    except client.exceptions.ApiException as e:
        if e.status == 404:
            return False
        raise
    return pod.metadata.uid == labels["pod-uid"]


def admit(v1, pod):
    meta, ip = pod.metadata, pod.status.pod_ip
    profile = PROFILES.get(meta.namespace)
    # One session per pod, ever: an ended one is not replaced (its record lasts 24 h; give
    # sandboxes an activeDeadlineSeconds shorter than the profile's ttl).
    if not profile or not ip or sessions("pod-uid", meta.uid):
        return
    # Addresses are reused: one still bound to a pod that is gone is released first.
    for held in sessions("pod-ip", ip, state="live"):
        if held["labels"].get("managed-by") == MANAGER and not pod_exists(v1, held["labels"]):
            revoke(held, "its pod is gone")
    labels = {"managed-by": MANAGER, "namespace": meta.namespace, "pod": meta.name,
              "pod-uid": meta.uid, "pod-ip": ip}
    task = (meta.annotations or {}).get("latchkey.dev/task")
    if task:
        labels["task"] = task
    status, body = admin("POST", "/sessions", {"profile": profile, "source": ip, "labels": labels})
    print(f"admit {meta.namespace}/{meta.name} {ip}: {status} {body.get('id') or body.get('error')}",
          flush=True)


def release(pod):
    for s in sessions("pod-uid", pod.metadata.uid, state="live"):
        revoke(s, f"pod {pod.metadata.namespace}/{pod.metadata.name} ended")


def sweep(v1):
    for s in sessions("managed-by", MANAGER, state="live"):
        if not pod_exists(v1, s["labels"]):
            revoke(s, "its pod is gone")


def main():
    config.load_incluster_config()
    v1 = client.CoreV1Api()
    while True:
        try:
            sweep(v1)
            # A new watch starts with every current pod (ADDED), so a restart catches up.
            stream = watch.Watch().stream(v1.list_pod_for_all_namespaces,
                                          label_selector=SELECTOR, timeout_seconds=300)
            for event in stream:
                pod = event["object"]
                if (event["type"] == "DELETED" or pod.metadata.deletion_timestamp
                        or pod.status.phase in ("Succeeded", "Failed")):
                    release(pod)
                else:
                    admit(v1, pod)
        except Exception as e:  # the API server or latchkey went away: start over
            print(f"watch: {e}; starting over", flush=True)
            time.sleep(5)


if __name__ == "__main__":
    main()
