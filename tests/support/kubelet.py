"""What the kubelet does to a container's strings before it starts it: `$(VAR)` in an
env value (from the variables before it), and in command and args (from all of them),
replaced by the variable's value, left as it is when there is none; `$$` made `$`. A
port of Kubernetes' `third_party/forked/golang/expansion` Expand, so that tests check a
rendered pod against the rules the kubelet applies, not against our own escaping."""
from __future__ import annotations

from collections.abc import Mapping


def expand(text: str, env: Mapping[str, str]) -> str:
    out, checkpoint, cursor = [], 0, 0
    while cursor < len(text):
        if text[cursor] == "$" and cursor + 1 < len(text):
            out.append(text[checkpoint:cursor])
            rest = text[cursor + 1:]
            if rest[0] == "$":                      # escaped operator
                read, advance = "$", 1
            elif rest[0] == "(":
                close = rest.find(")", 1)
                if close == -1:                     # incomplete reference: kept
                    read, advance = "$(", 1
                else:
                    name = rest[1:close]
                    read = env[name] if name in env else f"$({name})"
                    advance = close + 1
            else:                                   # an operator starting nothing
                read, advance = "$" + rest[0], 1
            out.append(read)
            cursor += advance
            checkpoint = cursor + 1
        cursor += 1
    return "".join(out) + text[checkpoint:]


def started(container: Mapping, downward: Mapping[str, str] | None = None) -> dict:
    """{"env", "command", "args"} as the container's process gets them; `downward` gives
    the values of variables set from the downward API (`valueFrom`)."""
    env: dict[str, str] = {}
    for item in container.get("env", []):
        if "valueFrom" in item:
            env[item["name"]] = (downward or {})[item["name"]]
        else:
            env[item["name"]] = expand(item.get("value", ""), env)
    return {"env": env, "command": [expand(c, env) for c in container.get("command", [])],
            "args": [expand(a, env) for a in container.get("args", [])]}
