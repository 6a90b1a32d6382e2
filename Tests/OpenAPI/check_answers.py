#!/usr/bin/env python3
"""Checks real answers of the server against docs/openapi.json.

    check_answers.py OPENAPI_JSON ANSWERS_JSON

ANSWERS_JSON is a list of {"label", "path", "method", "status", "headers", "body"} (headers
with lower-case names; body the response text), and optionally "schema": a JSON pointer into
the document for answers whose body the description leaves open (a `201` that has a body
only with `Prefer: return=representation`). Each answer must be documented for its
operation and status; its required headers present and valid; its media type documented; its
body valid against the documented schema (formats included). Prints one line per answer and
exits 1 when any fails.
"""
import json
import sys

from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

BASE = "urn:trunk-sync:openapi"


def escape(part):
    return part.replace("~", "~0").replace("/", "~1")


def lookup(document, pointer):
    node = document
    for part in pointer.lstrip("#/").split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def follow(document, node, pointer):
    """The object at `pointer`, following `$ref`s; and the pointer it was found at."""
    while "$ref" in node:
        pointer = node["$ref"]
        node = lookup(document, pointer)
    return node, pointer


def main(document_path, answers_path):
    document = json.load(open(document_path, encoding="utf-8"))
    registry = Registry().with_resource(BASE, Resource(contents=document, specification=DRAFT202012))

    def errors(pointer, instance):
        validator = Draft202012Validator(
            {"$ref": BASE + pointer}, registry=registry, format_checker=Draft202012Validator.FORMAT_CHECKER)
        return [f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}" for e in validator.iter_errors(instance)]

    failed = 0
    answers = json.load(open(answers_path, encoding="utf-8"))
    for answer in answers:
        label = f"{answer['label']} ({answer['method']} {answer['path']} → {answer['status']})"
        problems = []
        operation = document["paths"].get(answer["path"], {}).get(answer["method"].lower())
        status = str(answer["status"])
        if operation is None:
            problems.append("no such operation")
        elif status not in operation["responses"]:
            problems.append(f"status not documented (documented: {', '.join(operation['responses'])})")
        else:
            pointer = "#/" + "/".join(escape(p) for p in ["paths", answer["path"], answer["method"].lower(), "responses", status])
            response, pointer = follow(document, operation["responses"][status], pointer)
            headers = answer["headers"]
            for name, header in response.get("headers", {}).items():
                header, header_pointer = follow(document, header, pointer + "/headers/" + escape(name))
                value = headers.get(name.lower())
                if value is None:
                    if header.get("required"):
                        problems.append(f"header {name} missing")
                    continue
                if header.get("schema", {}).get("type") == "integer":
                    try:
                        value = int(value)
                    except ValueError:
                        pass
                problems += [f"header {name}: {e}" for e in errors(header_pointer + "/schema", value)]
            content = response.get("content")
            body = answer["body"]
            media_type = (headers.get("content-type") or "").split(";")[0].strip()
            if content:
                if media_type not in content:
                    problems.append(f"media type {media_type or '(none)'} not documented ({', '.join(content)})")
                elif media_type == "application/json":
                    schema_pointer = pointer + "/content/application~1json/schema"
                    problems += errors(schema_pointer, json.loads(body))
            elif "schema" in answer:
                if media_type != "application/json":
                    problems.append(f"media type {media_type or '(none)'}, expected application/json")
                else:
                    problems += errors(answer["schema"], json.loads(body))
            elif body:
                problems.append(f"a body where none is documented: {body[:200]!r}")
        if problems:
            failed += 1
            print(f"FAIL {label}")
            for problem in problems:
                print(f"    {problem}")
            print(f"    body: {answer['body'][:500]}")
        else:
            print(f"ok {label}")
    print(f"{len(answers) - failed} answers match the description, {failed} do not")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
