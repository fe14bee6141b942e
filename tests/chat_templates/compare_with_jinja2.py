#!/usr/bin/python3
"""Renders the chat template corpus (tests/data/chat_templates) with real Jinja and with our
renderer, and checks that the two agree byte for byte.

Real Jinja is Debian's python3-jinja2 set up as HF transformers sets it up for
apply_chat_template: ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with
the loopcontrols extension, a raise_exception() global, a strftime_now() global and a tojson
filter that is json.dumps(ensure_ascii=False). The variables are what the server passes to a
template for an OpenAI chat request (docs/api.md, "Chat templates"), computed here on their
own from the request: messages (role, content, name, tool_calls with the arguments as an
object, tool_call_id), tools, documents=None, add_generation_prompt, bos_token / eos_token and
the request's chat_template_kwargs; when that fails, the server's fallbacks (arguments as JSON
text, "" for null content), in its order.

Our side is the render_chat_template tool, which sends the same OpenAI request through the
server's request parser and ChatTemplate.

Usage: compare_with_jinja2.py RENDER_CHAT_TEMPLATE_BINARY CORPUS_DIR
Exit: 0 all equal, 1 a difference (printed), 77 no jinja2 module.
"""

import datetime
import json
import os
import subprocess
import sys

try:
    import jinja2
    import jinja2.ext
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    print("SKIPPED: /usr/bin/python3 has no jinja2 module (apt-get install python3-jinja2)")
    sys.exit(77)

# A fixed clock for strftime_now(), so both sides print the same date.
NOW = 1730000000
# What ChatTemplate's load-time probe sends (server/chat_template.cc).
PROBE = "thermocline-probe-7f3a"


def make_env(now):
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])

    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.fromtimestamp(now).strftime(fmt)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "The city, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"],
                         "description": "The temperature unit"},
            },
            "required": ["location"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web — results in any language",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "What to look for"},
                "max_results": {"type": "integer", "description": "How many results"},
                "sites": {"type": "array", "items": {"type": "string"},
                          "description": "Sites to search"},
            },
            "required": ["query"],
        },
    },
}
TOOLS = [WEATHER_TOOL, SEARCH_TOOL]

# Mistral's template wants 9-character alphanumeric call ids.
CALL = {"id": "call12345", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"location\": \"Paris\", \"unit\": \"celsius\"}"}}
CALL2 = {"id": "call67890", "type": "function",
         "function": {"name": "search", "arguments": "{\"query\": \"événements à Paris\", \"max_results\": 3}"}}

SYSTEM = {"role": "system", "content": "You are a terse assistant."}
USER = {"role": "user", "content": "What is the weather in Paris?"}

CONVERSATIONS = {
    "user": {"messages": [{"role": "user", "content": "Hello, who are you?"}]},
    "system_user": {"messages": [SYSTEM, {"role": "user", "content": "What is 2+2?"}]},
    "multi_turn": {"messages": [
        SYSTEM, {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello. How can I help?"},
        {"role": "user", "content": "Tell me a joke."}]},
    "multi_turn_no_system": {"messages": [
        {"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Bye."}, {"role": "assistant", "content": "Goodbye."}]},
    "unicode": {"messages": [
        {"role": "user", "content": "Größe? 中文 \"quotes\" 'single' back\\slash\nnew line\ttab  "},
        {"role": "assistant", "content": "  padded answer with emoji 🙂  "},
        {"role": "user", "content": "{{ not a template }} {% neither %}"}]},
    "developer": {"messages": [{"role": "developer", "content": "Answer in French."},
                               {"role": "user", "content": "Hello"}]},
    "parts": {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "Part one. "}, {"type": "text", "text": "Part two."}]}]},
    "think": {"messages": [
        {"role": "user", "content": "What is 3*7?"},
        {"role": "assistant", "content": "<think>\n3 times 7 is 21.\n</think>\n\nIt is 21."},
        {"role": "user", "content": "And 3*8?"}]},
    "named_user": {"messages": [{"role": "user", "content": "Hi", "name": "alice"}]},
    "tools": {"tools": TOOLS, "messages": [SYSTEM, USER]},
    "tools_no_system": {"tools": [WEATHER_TOOL], "messages": [USER]},
    "tool_calls": {"tools": TOOLS, "messages": [
        SYSTEM, USER,
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call12345", "content": "{\"temperature\": 21}"},
        {"role": "assistant", "content": "It is 21 °C in Paris."},
        {"role": "user", "content": "And events there?"}]},
    "parallel_tool_calls": {"tools": TOOLS, "messages": [
        USER,
        {"role": "assistant", "content": None, "tool_calls": [CALL, CALL2]},
        {"role": "tool", "tool_call_id": "call12345", "content": "{\"temperature\": 21}"},
        {"role": "tool", "tool_call_id": "call67890", "content": "[\"Fête de la musique\"]"}]},
    "tool_calls_without_tools": {"messages": [
        USER,
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call12345", "content": "sunny"},
        {"role": "assistant", "content": "Sunny."}]},
    "kwargs": {"tools": [WEATHER_TOOL], "messages": [USER],
               "chat_template_kwargs": {"enable_thinking": False, "date_string": "01 Jan 2025",
                                        "tools_in_user_message": False}},
    "kwargs_thinking_on": {"messages": [USER], "chat_template_kwargs": {"enable_thinking": True}},
}


def convert_messages(messages, parts_ok, object_arguments, null_content):
    """An OpenAI request's messages as the server passes them to a template."""
    out = []
    for m in messages:
        role = "system" if m["role"] == "developer" else m["role"]
        d = {"role": role}
        content = m.get("content")
        if content is None:
            d["content"] = None if null_content else ""
        elif isinstance(content, list):
            d["content"] = ([{"type": "text", "text": p["text"]} for p in content]
                            if parts_ok and content else "".join(p["text"] for p in content))
        else:
            d["content"] = content
        if m.get("name"):
            d["name"] = m["name"]
        if m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                arguments = c["function"].get("arguments", "")
                if object_arguments:
                    try:
                        parsed = json.loads(arguments)
                        if isinstance(parsed, dict):
                            arguments = parsed
                    except ValueError:
                        pass
                calls.append({"id": c.get("id", ""), "type": c.get("type", "function"),
                              "function": {"name": c["function"].get("name", ""),
                                           "arguments": arguments}})
            d["tool_calls"] = calls
        if m.get("tool_call_id"):
            d["tool_call_id"] = m["tool_call_id"]
        out.append(d)
    return out


def render(template, variables, now):
    try:
        return True, make_env(now).from_string(template).render(**variables)
    except TemplateError as e:
        return False, str(e)
    except Exception as e:  # TypeError, ValueError ... inside the template
        return False, "%s: %s" % (type(e).__name__, e)


def variables_for(entry, messages, tools, agp, kwargs):
    v = {"messages": messages, "tools": tools, "documents": None, "add_generation_prompt": agp}
    if entry.get("bos_token"):
        v["bos_token"] = entry["bos_token"]
    if entry.get("eos_token"):
        v["eos_token"] = entry["eos_token"]
    v.update(kwargs or {})
    return v


def parts_supported(entry, template):
    probe = [{"role": "user", "content": [{"type": "text", "text": PROBE}]}]
    ok, text = render(template, variables_for(entry, probe, None, True, None), 0)
    return ok and PROBE in text and "'type': 'text'" not in text


def expected(entry, templates, conversation, agp):
    """What jinja2 renders for the request (ok, text or error)."""
    tools = conversation.get("tools")
    template = templates["tool_use"] if tools is not None and templates.get("tool_use") else templates["default"]
    parts_ok = parts_supported(entry, templates["default"])
    kwargs = conversation.get("chat_template_kwargs")
    msgs = conversation["messages"]
    # First as HF does (arguments as objects, null content as None), then the fallbacks the
    # server tries, in its order.
    ok, text = render(template, variables_for(
        entry, convert_messages(msgs, parts_ok, True, True), tools, agp, kwargs), NOW)
    if ok:
        return ok, text
    calls = any(m.get("tool_calls") for m in msgs)
    nulls = any(m.get("content", None) is None for m in msgs)
    for object_arguments, null_content in ((False, True), (True, False), (False, False)):
        if (not object_arguments and not calls) or (not null_content and not nulls):
            continue
        ok2, text2 = render(template, variables_for(
            entry, convert_messages(msgs, parts_ok, object_arguments, null_content), tools, agp,
            kwargs), NOW)
        if ok2:
            return ok2, text2
    return ok, text


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    binary, corpus = sys.argv[1], sys.argv[2]
    entries = json.load(open(os.path.join(corpus, "templates.json"), encoding="utf-8"))
    jobs, keys = [], []
    for entry in entries:
        templates = {"default": open(os.path.join(corpus, entry["template"]), encoding="utf-8",
                                     newline="").read()}
        if entry.get("tool_use_template"):
            templates["tool_use"] = open(os.path.join(corpus, entry["tool_use_template"]),
                                         encoding="utf-8", newline="").read()
        for name, conversation in CONVERSATIONS.items():
            for agp in (True, False):
                request = {"model": "m", "messages": conversation["messages"]}
                for k in ("tools", "chat_template_kwargs"):
                    if k in conversation:
                        request[k] = conversation[k]
                job = {"template": templates["default"], "bos_token": entry["bos_token"],
                       "eos_token": entry["eos_token"], "request": request,
                       "add_generation_prompt": agp, "now": NOW}
                if "tool_use" in templates:
                    job["tool_use_template"] = templates["tool_use"]
                jobs.append(job)
                keys.append((entry, templates, name, conversation, agp))

    stdin = "".join(json.dumps(j, ensure_ascii=False) + "\n" for j in jobs)
    run = subprocess.run([binary], input=stdin.encode("utf-8"), capture_output=True, timeout=240)
    if run.returncode != 0:
        print("render_chat_template failed (%d): %s" % (run.returncode, run.stderr.decode()))
        return 1
    results = [json.loads(line) for line in run.stdout.decode("utf-8").splitlines()]
    if len(results) != len(jobs):
        print("render_chat_template answered %d of %d requests" % (len(results), len(jobs)))
        return 1

    failures = 0
    per_template = {}
    for (entry, templates, name, conversation, agp), ours in zip(keys, results):
        ok, text = expected(entry, templates, conversation, agp)
        stats = per_template.setdefault(entry["name"], {"equal": 0, "both_refuse": 0, "names": set()})
        label = "%s / %s / add_generation_prompt=%s" % (entry["name"], name, agp)
        if ok and ours["ok"] and ours["text"] == text:
            stats["equal"] += 1
            stats["names"].add(name)
            continue
        if not ok and not ours["ok"]:
            # Both refuse the conversation; a template's own raise_exception message must come
            # through unchanged.
            if text.startswith(("TypeError", "ValueError", "UndefinedError", "SecurityError")) or text in ours["error"]:
                stats["both_refuse"] += 1
                continue
        failures += 1
        print("DIFFERENT: %s" % label)
        print("  jinja2: %s %r" % ("ok" if ok else "error", text))
        print("  ours:   %s %r" % ("ok" if ours["ok"] else "error",
                                   ours["text"] if ours["ok"] else ours["error"]))

    for entry in entries:
        stats = per_template[entry["name"]]
        print("%-30s %3d equal, %2d refused by both" % (entry["name"], stats["equal"],
                                                        stats["both_refuse"]))
        # Each template must render real conversations, and those with tools where it has them.
        must = {"user", "multi_turn_no_system", "unicode"}
        if entry["tools"]:
            must |= {"tools", "tool_calls"}
        missing = must - stats["names"]
        if missing:
            failures += 1
            print("  %s: no byte-identical render of %s" % (entry["name"], sorted(missing)))
    print("%d templates, %d renders compared, %d failures" % (len(entries), len(jobs), failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
