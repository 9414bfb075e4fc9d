"""Validates latchkey's `--audit-format ocsf` lines against the published OCSF schema.

Usage: ocsf_validate.py FILE

FILE holds audit lines as latchkey writes them: each an OCSF event with the hash chain's `seq`
and `prev` in front, and now and then a checkpoint line (`{"seq", "prev", "checkpoint"}`).
Checkpoints are skipped; `seq` and `prev` are taken off each event (the chain is checked by the
Rust test, not here) and the rest must be a valid event of its class:

- the JSON Schema (draft 2020-12) that `ocsf-json-schema` generates from the schema export of
  schema.ocsf.io it ships (the version the event names in `metadata.version`), for the class
  named by `class_uid` with the profiles the event lists in `metadata.profiles`: required
  attributes, types, enums, `at_least_one` constraints, no attribute the class does not have;
- what the schema states in words and JSON Schema cannot: `type_uid` is `class_uid * 100 +
  activity_id`, `category_uid` is the class's category, and every `*_name` / sibling caption
  (`class_name`, `category_name`, `activity_name`, `type_name`, `severity`, `status`, `action`,
  `disposition`, `rcode`) is the schema's caption for its id (except for id 99, "Other", whose
  caption is the source's own).

Prints one JSON object: {"version", "events", "classes": {class_uid: count}, "errors": [{"line",
"class_uid", "errors": [...]}]}; exits 0 when there are no errors, 1 when there are.
"""

import json
import sys

from jsonschema import Draft202012Validator
from ocsf_json_schema import OcsfJsonSchemaEmbedded, get_ocsf_schema

# Sibling captions checked against the schema's enum of their id attribute.
SIBLINGS = [
    ("activity_id", "activity_name"),
    ("severity_id", "severity"),
    ("status_id", "status"),
    ("action_id", "action"),
    ("disposition_id", "disposition"),
    ("rcode_id", "rcode"),
]

_schemas = {}
_validators = {}


def schema(version):
    if version not in _schemas:
        _schemas[version] = get_ocsf_schema(version=version)
    return _schemas[version]


def class_of(raw, class_uid):
    for name, cls in raw["classes"].items():
        if cls.get("uid") == class_uid:
            return name, cls
    return None, None


def validator(version, class_name, profiles):
    key = (version, class_name, tuple(sorted(profiles)))
    if key not in _validators:
        js = OcsfJsonSchemaEmbedded(schema(version)).get_class_schema(
            class_name=class_name, profiles=list(profiles)
        )
        Draft202012Validator.check_schema(js)
        _validators[key] = Draft202012Validator(js)
    return _validators[key]


def check(event):
    errors = []
    metadata = event.get("metadata")
    if not isinstance(metadata, dict) or not isinstance(metadata.get("version"), str):
        return ["metadata.version is missing: no schema version to validate against"]
    version = metadata["version"]
    try:
        raw = schema(version)
    except Exception as e:  # an unknown version
        return [f"no published OCSF schema {version!r}: {e}"]
    class_uid = event.get("class_uid")
    class_name, cls = class_of(raw, class_uid)
    if cls is None:
        return [f"class_uid {class_uid!r} is no class of OCSF {version}"]
    profiles = metadata.get("profiles") or []
    for p in profiles:
        if p not in raw["profiles"]:
            errors.append(f"metadata.profiles names {p!r}, no profile of OCSF {version}")
    if errors:
        return errors
    for e in sorted(validator(version, class_name, profiles).iter_errors(event), key=str):
        where = "/".join(str(p) for p in e.absolute_path) or "(event)"
        errors.append(f"{where}: {e.message}")

    attributes = cls["attributes"]
    activity_id = event.get("activity_id")
    if isinstance(activity_id, int) and event.get("type_uid") != class_uid * 100 + activity_id:
        errors.append(
            f"type_uid {event.get('type_uid')!r} is not class_uid * 100 + activity_id "
            f"({class_uid * 100 + activity_id})"
        )
    if event.get("category_uid") != cls.get("category_uid"):
        errors.append(
            f"category_uid {event.get('category_uid')!r} is not {class_name}'s category "
            f"{cls.get('category_uid')}"
        )
    if "class_name" in event and event["class_name"] != cls.get("caption"):
        errors.append(f"class_name {event['class_name']!r} is not {cls.get('caption')!r}")
    if "category_name" in event and event["category_name"] != cls.get("category_name"):
        errors.append(
            f"category_name {event['category_name']!r} is not {cls.get('category_name')!r}"
        )
    for id_attr, caption_attr in SIBLINGS:
        if id_attr not in event or caption_attr not in event:
            continue
        enum = (attributes.get(id_attr) or {}).get("enum") or {}
        entry = enum.get(str(event[id_attr]))
        if entry is None or event[id_attr] == 99:
            continue
        if event[caption_attr] != entry.get("caption"):
            errors.append(
                f"{caption_attr} {event[caption_attr]!r} is not the caption of "
                f"{id_attr} {event[id_attr]} ({entry.get('caption')!r})"
            )
    if "type_name" in event and isinstance(activity_id, int):
        enum = (attributes.get("activity_id") or {}).get("enum") or {}
        entry = enum.get(str(activity_id))
        if entry is not None and activity_id != 99:
            expected = f"{cls.get('caption')}: {entry.get('caption')}"
            if event["type_name"] != expected:
                errors.append(f"type_name {event['type_name']!r} is not {expected!r}")
    return errors


def main():
    if len(sys.argv) != 2:
        print("usage: ocsf_validate.py FILE", file=sys.stderr)
        return 2
    out = {"version": None, "events": 0, "classes": {}, "errors": []}
    with open(sys.argv[1], encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
            except ValueError as e:
                out["errors"].append({"line": n, "class_uid": None, "errors": [f"not JSON: {e}"]})
                continue
            if "checkpoint" in doc:
                continue
            event = {k: v for k, v in doc.items() if k not in ("seq", "prev")}
            out["events"] += 1
            uid = event.get("class_uid")
            out["classes"][str(uid)] = out["classes"].get(str(uid), 0) + 1
            version = (event.get("metadata") or {}).get("version")
            out["version"] = out["version"] or version
            errors = check(event)
            if errors:
                out["errors"].append({"line": n, "class_uid": uid, "errors": errors})
    print(json.dumps(out, indent=1))
    return 1 if out["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
