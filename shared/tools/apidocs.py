"""Generate ``docs/api.md`` from the OpenAPI documents of both services, so the document never drifts.

``python -m shared.tools.apidocs > docs/api.md`` writes it; ``python -m shared.tools.apidocs --check``
exits 1 (with a short diff) when the committed file differs from what the code documents. Both apps are built
in a temporary data dir and only their ``openapi()`` is read; the output holds no path, time or random value.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import difflib
import json
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from pydantic import SecretStr

from shared.files import write_text_atomic

JSON = dict[str, Any]

DOC_PATH = Path(__file__).resolve().parents[2] / "docs" / "api.md"
REGENERATE = "pobo docs api (or make docs)"
METHODS = ("get", "post", "put", "patch", "delete", "head", "options")
TABLE_RULE = "|---|---|---|---|---|"
OK_DESCRIPTION = "Successful Response"  # FastAPI's placeholder for an undocumented success response

PREAMBLE = """\
# pobo HTTP API

<!-- Generated from the services' OpenAPI documents by `pobo docs api` (`make docs`).
     Do not edit by hand: tests/test_api_docs.py fails when this file and the code disagree. -->

pobo runs privacy-preserving outsourced Bayesian optimisation between two organisations that talk to each
other over plain HTTPS/REST:

* the **curator** service (default address `http://127.0.0.1:8001`) runs at the data holder, for example
  a hospital's data team. It keeps the patient rows, turns them into differentially private *releases*,
  hands out partner tokens and answers "what is the outcome of row *i*?" queries;
* the **modeler** service (default address `http://127.0.0.1:8002`) runs at the party doing the modelling,
  for example a consultancy. It downloads a release it was granted and runs a *study* over it with a
  strategy of its registry (GP-UCB, batch GP-UCB, random, ...), in rounds of one or more questions to the
  curator, keeping a hash-chained audit log of every question.

Both listen on the loopback address unless configured otherwise; put them behind TLS (or serve TLS
directly) before exposing them to another organisation. For a step-by-step session with `curl`, see
[api-walkthrough.md](api-walkthrough.md).

## Authentication

Every `/v1` call needs the header `Authorization: Bearer <token>`. Without a valid token the answer is
`401`. `/healthz`, `/docs`, `/redoc` and `/openapi.json` are open (no token).

* **Curator, admin token.** One token for the data team (setting `POBO_CURATOR_ADMIN_TOKEN`, or generated
  on first start into `<data dir>/admin-token`). It runs the curator: uploads datasets, creates releases,
  manages partners, reads the access log and posts measured outcomes.
* **Curator, partner tokens.** Created by the admin with `POST /v1/partners` and shown only in that
  response. A partner token can read only the releases granted to it and ask a limited number of queries
  (its quota); on an admin-only endpoint or an ungranted release it gets `403`. Revoking a partner
  (`DELETE /v1/partners/{partner_id}`) makes its token answer `401`.
* **Modeler, single token.** The modeler has one token for all its endpoints (setting
  `POBO_MODELER_TOKEN`, or generated on first start into `<data dir>/token`). The curator partner token a
  study uses is sent once, when the study is created, stored encrypted and never returned.

A client that sends too many invalid tokens is locked out for a while with `429` and `Retry-After`.

## Errors and status codes

Every error body is JSON of the form `{"detail": "<message>"}`; the message is meant for a person to read
and act on. A request that fails validation (`422`) also carries `errors`: a list with one entry per
invalid field (`loc`, `msg`, `type`), the same on both services. Neither service echoes the rejected input
back.

| Status | Meaning |
|---|---|
| `400` | The request is malformed (for example an invalid `Content-Length`). |
| `401` | Missing, invalid or revoked token. |
| `403` | A valid token that may not do this (a partner token on an admin endpoint or ungranted release). |
| `404` | No such dataset, population, release, partner, query or study. |
| `409` | Conflicts with the current state: the budget would be exceeded, a query is already answered, ... |
| `413` | The request body is too large (the CSV upload has its own, larger limit). |
| `422` | The request is well-formed but its content is invalid; see `errors`. |
| `429` | A partner's query quota is used up, or too many invalid tokens (then with `Retry-After`). |
| `503` | The database (or, for the modeler, the curator) is unavailable; retry after `Retry-After` seconds. |

## Idempotency

`POST /v1/releases/{release_id}/queries` accepts an `Idempotency-Key` header: any unique string per
logical query. Sending the same key again (a retry after a timeout, even a concurrent one) returns the
query already on record and never charges the quota twice; such a replayed answer carries the header
`Idempotent-Replayed: true`. Reusing a key for a different release or row index is a `409`. The modeler
sends one key per request of a round (`<study>:<round>` for the first request of a round,
`<study>:<round>.<j>` for the others), so a round retried or resumed after a crash is never charged twice.

## Strategies and rounds

A study names a `strategy` from the modeler's registry (`GET /v1/strategies` lists each with a description
and the JSON schema of its parameters) and passes its parameters as `strategy_params`; unknown keys or bad
values are a `422` that lists what the strategy accepts. The top-level fields `delta_prime`,
`hyperparameters`, `initial_points` and `exclude_queried` of the first API version remain shorthands for
the `strategy_params` keys of the same names. A study runs in *rounds*: the strategy plans one or more
requests (today: the outcome of a row, by index), the modeler records the whole round before sending its
first request, and records the answers once every request of the round is answered (for a `manual`
dataset, once every sample is measured, in any order). `POST /v1/studies/{study_id}/step` runs one round;
its answer has `round` and `queries`, and a one-request round also fills the per-query fields `iteration`,
`index`, `y`, `acquisition`, `beta`, `mean`, `std`. Audit entries carry `round`, `request`, `kind` and the
strategy's `details`; `iterations` and `iterations_done` count curator queries, `rounds_done` rounds. The
parameters of each strategy are listed under [Strategy parameters](#strategy-parameters).

## Privacy fields

Every release has a `mechanism`. `gaussian` (the default) adds Gaussian noise to the scaled rows; it is
(epsilon, delta)-differentially private for one row moving by Euclidean norm at most 1 in the scaled units,
and its `noise_std` is public. `po-gp-ucb` is Algorithm 1 of the PO-GP-UCB paper, kept so that the paper
can be reproduced: it carries **no formal guarantee** when n > d + 1, and the curator only releases it
with `"acknowledge_no_guarantee": true`. Every release reports `formal_guarantee`, true only when the
(epsilon, delta) promise really holds. A delta of 1/n or more would allow publishing a whole row with
probability delta, so such a release needs `"allow_large_delta": true`.

Datasets belong to a `population` (the people behind the rows), and all datasets of one population spend
from one shared budget. Name it with the upload field `population`; if you leave it out, an upload of the
same rows again (also reordered, renamed, or with more or fewer features) joins the earlier dataset's
population automatically. `GET /v1/populations`, `GET /v1/populations/{population_id}` and
`GET /v1/populations/{population_id}/ledger` show populations, their budgets and their ledgers. Each ledger
entry records the mechanism's `native` parameters (for Gaussian releases the noise multiplier,
sensitivity and sigma) for auditors who want a tighter accountant than the plain sum; `epsilon_pld` is
such a tighter composition, shown for information only (the budget is enforced on the plain sums).

The privacy model (what is protected, the units, the budget) is described in [privacy.md](privacy.md).

## Interactive documentation

Each service serves its own interactive documentation at `/docs` (Swagger UI) and `/redoc` (ReDoc), and
the machine-readable document at `/openapi.json`. They work without internet access. The reference below
is generated from those same documents.

## Browser console

Each service also serves a browser console at `/console` (HTML pages, not part of the API's OpenAPI
document): the curator's for its administrator, the modeler's for the modeler's team. It signs in with the
service's operator token only (the curator's admin token, the modeler's token; partner and agent tokens are
refused), into a signed HttpOnly, SameSite=Strict session cookie; failed sign-ins count against the same
throttle as failed API tokens. `POBO_CURATOR_CONSOLE=false` / `POBO_MODELER_CONSOLE=false` turn it off.
The pages, and how they are protected, are described in [console.md](console.md).
"""


@dataclass(frozen=True)
class Service:
    key: str
    name: str
    address: str
    document: JSON


def openapi_documents() -> list[Service]:
    """Build both apps in a throwaway data dir and return their OpenAPI documents."""
    from curator_service.config import Settings
    from curator_service.main import create_app
    from modeler_service.config import Settings as MSettings
    from modeler_service.main import create_app as create_modeler

    async def read(app: FastAPI) -> JSON:
        async with app.router.lifespan_context(app):  # the lifespan's exit closes the databases
            return dict(app.openapi())

    with tempfile.TemporaryDirectory(prefix="pobo-apidocs-") as tmp, contextlib.redirect_stdout(sys.stderr):
        base = Path(tmp)
        admin, token = SecretStr("x" * 40), SecretStr("y" * 40)
        curator = asyncio.run(read(create_app(Settings(data_dir=base / "curator", admin_token=admin))))
        modeler = asyncio.run(read(create_modeler(MSettings(data_dir=base / "modeler", token=token))))
        if any(path in json.dumps([curator, modeler]) for path in (tmp, str(DOC_PATH.parent.parent))):
            raise RuntimeError("an OpenAPI document contains a local path (the data dir or the checkout)")
    return [
        Service("curator", "Curator", "http://127.0.0.1:8001", curator),
        Service("modeler", "Modeler", "http://127.0.0.1:8002", modeler),
    ]


def _text(text: str) -> str:
    """Escape ``<`` before a tag-like name outside code spans (``<token>`` would be taken for HTML)."""
    return re.sub(
        r"(`+).*?\1|<(?=[A-Za-z/!?])", lambda m: "\\<" if m.group(0) == "<" else m.group(0), text, flags=re.S
    )


def _cell(text: str) -> str:
    """One table cell: a single line, pipes escaped."""
    return _text(" ".join(text.split())).replace("|", "\\|")


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _who(operation: JSON) -> str | None:
    """Who may call, if the summary or description says so (a parenthesis starting with admin/partner),
    else if the 403 description does ("... admin-only)", "Not the admin token", "The admin token")."""
    text = f"{operation.get('summary', '')} {operation.get('description', '')}"
    found = [m for m in re.findall(r"\(([^()]*)\)", text) if re.match(r"(admin|partner)\b", m, re.I)]
    if found:
        return "; ".join(dict.fromkeys(found))
    forbidden = str(operation.get("responses", {}).get("403", {}).get("description", "")).strip(" .").lower()
    if forbidden.endswith("this endpoint is admin-only)") or forbidden == "not the admin token":
        return "admin only"
    return "partner tokens only" if forbidden == "the admin token" else None


def _status_key(code: str) -> tuple[int, str]:
    return (int(code), code) if code.isdigit() else (1000, code)


@dataclass
class Renderer:
    """Renders one service; collects the object schemas its fields refer to ("nested objects")."""

    service: Service
    nested: set[str] = field(default_factory=set)

    @property
    def schemas(self) -> JSON:
        found: JSON = self.service.document.get("components", {}).get("schemas", {})
        return found

    def anchor(self, name: str) -> str:
        return f"{self.service.key}-{_slug(name)}"

    def resolve(self, schema: JSON) -> tuple[str | None, JSON]:
        if "$ref" in schema:
            name = str(schema["$ref"]).rsplit("/", 1)[-1]
            return name, self.schemas.get(name, {})
        return None, schema

    def type_of(self, schema: JSON) -> str:
        name, target = self.resolve(schema)
        if name is not None:
            if target.get("properties"):
                self.nested.add(name)
                return f"[{name}](#{self.anchor(name)})"
            return self.type_of(target) if target else name
        for key in ("anyOf", "oneOf"):
            if key in schema:
                return " | ".join(dict.fromkeys(self.type_of(part) for part in schema[key]))
        if "allOf" in schema:
            return " & ".join(self.type_of(part) for part in schema["allOf"])
        if "const" in schema:
            return json.dumps(schema["const"])
        if "enum" in schema:
            return " | ".join(json.dumps(value) for value in schema["enum"])
        kind = schema.get("type", "object" if "properties" in schema else None)
        if isinstance(kind, list):
            return " | ".join(self.type_of({**schema, "type": one}) for one in kind)
        if kind == "array":
            item = self.type_of(schema.get("items", {}))
            return f"array of ({item})" if " | " in item else f"array of {item}"
        if kind == "object":
            values = schema.get("additionalProperties")
            return f"object (values: {self.type_of(values)})" if isinstance(values, dict) and values else kind
        if kind == "string" and (schema.get("format") == "binary" or "contentMediaType" in schema):
            return "file"
        if kind is None:
            return "any"
        return f"{kind} ({schema['format']})" if "format" in schema else str(kind)

    def fields(self, schema: JSON) -> list[str]:
        """A schema's fields as a table (or its type, if it has no fields)."""
        properties: JSON = schema.get("properties", {})
        if not properties:
            return [f"Type: {_cell(self.type_of(schema))}", ""]
        required = set(schema.get("required", []))
        lines = ["| Field | Type | Required | Default | Description |", TABLE_RULE]
        for name, prop in properties.items():
            default = f"`{_cell(json.dumps(prop['default']))}`" if "default" in prop else ""
            yes = "yes" if name in required else "no"
            description = _cell(str(prop.get("description", "")))
            lines.append(f"| `{name}` | {_cell(self.type_of(prop))} | {yes} | {default} | {description} |")
        if schema.get("additionalProperties") is False:
            lines += ["", "Unknown fields are rejected (`422`)."]
        return [*lines, ""]

    def body_schema(self, schema: JSON, examples: bool) -> list[str]:
        """A request or response schema: its name and description, its fields, its examples."""
        parts: list[JSON] = schema.get("anyOf") or schema.get("oneOf") or [schema]
        objects = [part for part in parts if part.get("type") != "null"]
        name, target = self.resolve(objects[0]) if len(objects) == 1 else (None, {})
        if not target.get("properties"):
            return [("One of: " if len(objects) > 1 else "Type: ") + self.type_of(schema), ""]
        lines: list[str] = []
        description = " ".join(str(target.get("description", "")).split("\n\n")[0].split())
        if name is not None and not name.startswith("Body_"):
            nullable = " (or `null`)" if len(parts) > len(objects) else ""
            lines += [f"`{name}`{nullable}" + (f": {_text(description)}" if description else ""), ""]
        lines += self.fields(target)
        if examples and target.get("examples"):
            lines += ["Examples:", "", "```json", *(json.dumps(e) for e in target["examples"]), "```", ""]
        return lines

    def operation(self, path: str, method: str, op: JSON) -> list[str]:
        lines = [f"### {method.upper()} {path}", ""]
        if op.get("deprecated"):
            lines += ["**Deprecated.**", ""]
        for key in ("summary", "description"):
            if op.get(key):
                lines += [_text(str(op[key]).strip()), ""]
        access = "bearer token" if op.get("security") else "open (no token)"
        who = _who(op)
        lines += [f"**Access:** {access}" + (f"; who may call: {_text(who)}." if who else "."), ""]
        if op.get("parameters"):
            lines += ["**Parameters:**", "", "| Name | In | Required | Type | Description |", TABLE_RULE]
            for p in op["parameters"]:
                schema = p.get("schema", {})
                description = str(p.get("description", schema.get("description", ""))).strip()
                if "default" in schema:
                    stop = "" if not description or description.endswith(".") else "."
                    description += f"{stop} Default: `{json.dumps(schema['default'])}`."
                yes, kind = "yes" if p.get("required") else "no", _cell(self.type_of(schema))
                lines.append(f"| `{p['name']}` | {p['in']} | {yes} | {kind} | {_cell(description)} |")
            lines.append("")
        body = op.get("requestBody")
        if body:
            for content_type, media in sorted(body.get("content", {}).items()):
                required = "required" if body.get("required") else "optional"
                form = "; form fields" if content_type == "multipart/form-data" else ""
                lines += [f"**Request body** (`{content_type}`, {required}{form}):", ""]
                lines += self.body_schema(media.get("schema", {}), examples=True)
        responses: JSON = op.get("responses", {})
        others: list[str] = []
        for code in sorted(responses, key=_status_key):
            response = responses[code]
            description = _text(" ".join(str(response.get("description", "")).split()))
            if not code.startswith("2"):
                others.append(f"* `{code}`: {description or '(no description)'}")
                continue
            content: JSON = response.get("content", {})
            types = f" ({', '.join(f'`{t}`' for t in sorted(content))})" if content else ""
            detail = "" if description == OK_DESCRIPTION else f" {description}"
            lines += [f"**Response `{code}`**{types}.{detail}", ""]
            for header, spec in sorted(response.get("headers", {}).items()):
                lines += [f"* header `{header}`: {_text(str(spec.get('description', '')))}", ""]
            for content_type, media in sorted(content.items()):
                if content_type == "application/json" and media.get("schema"):
                    lines += [f"As `{content_type}`:", ""] if len(content) > 1 else []
                    lines += self.body_schema(media["schema"], examples=False)
        if others:
            lines += ["**Other responses:**", "", *others, ""]
        return lines

    def render(self) -> list[str]:
        doc = self.service.document
        info: JSON = doc.get("info", {})
        key, name = self.service.key, self.service.name
        tag_order = [str(t["name"]) for t in doc.get("tags", [])]
        groups: dict[str, list[tuple[str, str, JSON]]] = {}
        for path, item in doc.get("paths", {}).items():
            for method, op in item.items():
                if method in METHODS:
                    groups.setdefault((op.get("tags") or ["other"])[0], []).append((path, method, op))
        tags = [t for t in tag_order if t in groups] + sorted(set(groups) - set(tag_order))
        tag_descriptions = {str(t["name"]): str(t.get("description", "")) for t in doc.get("tags", [])}
        links = ", ".join(f"[{t}](#{key}-tag-{_slug(t)})" for t in tags)
        lines = [
            f'<a id="{key}"></a>',
            "",
            f"## {name} service",
            "",
            f"`{info.get('title', key)}`, version `{info.get('version', '')}`; default address "
            f"`{self.service.address}`. Tags: {links}.",
            "",
        ]
        for tag in tags:
            lines += [f'<a id="{key}-tag-{_slug(tag)}"></a>', "", f"## {name}: {tag}", ""]
            if tag_descriptions.get(tag):
                lines += [_text(tag_descriptions[tag]), ""]
            for path, method, op in sorted(groups[tag], key=lambda o: (o[0], METHODS.index(o[1]))):
                lines += self.operation(path, method, op)
        rendered: dict[str, list[str]] = {}
        while pending := sorted(self.nested - set(rendered)):
            for schema_name in pending:
                schema = self.schemas[schema_name]
                section = [f'<a id="{self.anchor(schema_name)}"></a>', "", f"### {schema_name}", ""]
                if schema.get("description"):
                    section += [_text(str(schema["description"]).strip()), ""]
                rendered[schema_name] = section + self.fields(schema)
        if rendered:
            lines += [f'<a id="{key}-nested-objects"></a>', "", f"## {name}: nested objects", ""]
            for schema_name in sorted(rendered):
                lines += rendered[schema_name]
        return lines


def strategies_section() -> list[str]:
    """Every strategy of the registry: its description and its parameters (from their JSON schemas)."""
    from shared.bo.strategies import catalogue

    lines = ['<a id="strategy-parameters"></a>', "", "## Strategy parameters", ""]
    for entry in catalogue():
        schema: JSON = entry["params_schema"]
        key = f"strategy-{_slug(entry['name'])}"
        renderer = Renderer(
            Service(key, entry["name"], "", {"components": {"schemas": schema.get("$defs", {})}})
        )
        lines += [f"### `{entry['name']}`", "", _text(entry["description"]), ""]
        lines += renderer.fields(schema)
        for name in sorted(renderer.nested):
            lines += [f'<a id="{renderer.anchor(name)}"></a>', "", f"`{name}`:", ""]
            lines += renderer.fields(renderer.schemas[name])
    return lines


def generate(services: list[Service] | None = None) -> str:
    """The whole Markdown document."""
    services = services if services is not None else openapi_documents()
    lines = [PREAMBLE.rstrip("\n"), "", "## Reference", ""]
    lines += [f"* [{s.name} service](#{s.key}) (`{s.address}`)" for s in services]
    lines += ["* [Strategy parameters](#strategy-parameters)", ""]
    for service in services:
        lines += Renderer(service).render()
    lines += strategies_section()
    text = "\n".join(lines)
    return re.sub(r"\n{3,}", "\n\n", text).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m shared.tools.apidocs", description="Write docs/api.md.")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 if docs/api.md is not up to date")
    mode.add_argument("--write", action="store_true", help="(re)write docs/api.md atomically")
    args = parser.parse_args(argv)
    text = generate()
    if args.write:
        write_text_atomic(DOC_PATH, text)
        return
    if not args.check:
        sys.stdout.write(text)
        return
    current = DOC_PATH.read_text(encoding="utf-8") if DOC_PATH.exists() else ""
    if current == text:
        return
    diff = list(difflib.unified_diff(current.splitlines(), text.splitlines(), "docs/api.md", "generated", ""))
    shown = diff[:60] + ([f"... ({len(diff) - 60} more diff lines)"] if len(diff) > 60 else [])
    print("\n".join(shown), file=sys.stderr)
    print(f"docs/api.md is out of date; regenerate with `{REGENERATE}`", file=sys.stderr)
    raise SystemExit(1)


if __name__ == "__main__":
    main()
