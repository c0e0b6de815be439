import json
import sys
import time

import pytest

from traces.toolparse import command_name, parse_tool, parse_tool_from_message

BASH = "THOUGHT: I need to run the tests to see the failure.\n\n```bash\n{cmd}\n```"


@pytest.mark.parametrize("cmd, tool", [
    ("git status", "git"),
    ('find . -name "*.py" | head -20', "find"),
    ("cd /repo && pytest -x", "cd"),
    ("FOO=1 BAR=2 python -m pytest tests/", "python"),
    ("sudo -E apt-get install -y jq", "apt-get"),
    ("ls -la; cat setup.py", "ls"),
    ("false || echo failed", "false"),
    ("# inspect the file\nsed -n '1,40p' src/app.py", "sed"),
    ("cat <<'EOF' > /tmp/x.py\nprint('hi')\nEOF", "cat"),
    ("echo 'unbalanced", "echo"),
])
def test_mini_swe_agent_bash_block(cmd, tool):
    assert parse_tool(BASH.format(cmd=cmd)) == tool


def test_bash_block_rules():
    two = "```bash\nls\n```\nthen\n```bash\npwd\n```"
    assert parse_tool(two) is None  # mini-swe-agent: exactly one action expected
    assert parse_tool("```\npytest -q\n```") == "pytest"  # unlabelled fence
    assert parse_tool("```sh\nmake test\n```") == "make"
    assert parse_tool("```python\nprint(1)\n```\n```bash\nls\n```") == "ls"  # one bash block counts
    assert parse_tool("```bash\nls -la\n") is None  # unclosed fence: no valid action
    assert parse_tool("```bash\n\n```") is None
    assert command_name("$ ls -la") == "ls"


def test_openai_formats():
    chat = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_abc", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]}
    assert parse_tool(json.dumps(chat)) == "get_weather"
    assert parse_tool_from_message(chat) == "get_weather"
    legacy = {"role": "assistant", "content": None, "function_call": {"name": "search", "arguments": "{}"}}
    assert parse_tool_from_message(legacy) == "search"
    # Responses API item, as in the Continuum paper, embedded in text
    item = '{"type": "function_call", "id": "fc_12345", "call_id": "call_12345", "name": "web_search", "arguments": "{\\"q\\": \\"x\\"}"}'
    assert parse_tool("Calling a tool now: " + item + " done") == "web_search"
    completion = {"id": "chatcmpl-1", "choices": [{"index": 0, "message": chat, "finish_reason": "tool_calls"}]}
    assert parse_tool(json.dumps(completion)) == "get_weather"
    assert parse_tool(json.dumps([{"name": "a", "arguments": {}}, {"name": "b", "arguments": {}}])) == "a"


def test_hermes_and_llama_formats():
    hermes = 'I will check.\n<tool_call>\n{"name": "get_stock_price", "arguments": {"symbol": "NVDA"}}\n</tool_call>'
    assert parse_tool(hermes) == "get_stock_price"
    assert parse_tool('<tool_call>{"name": "x", "arguments": {}}') == "x"  # stopped before the close tag
    assert parse_tool('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}<|eom_id|>') == "get_weather"
    assert parse_tool('<|python_tag|>brave_search.call(query="vllm")') == "brave_search"
    assert parse_tool("<|python_tag|>import math\nprint(math.pi)") == "python"
    assert parse_tool('{"name": "get_weather", "parameters": {"city": "Paris"}}') == "get_weather"
    assert parse_tool('[get_weather(city="Paris"), get_time(tz="CET")]') == "get_weather"
    assert parse_tool("get_weather(city='Paris')") == "get_weather"
    assert parse_tool("[list_files()]") == "list_files"
    assert parse_tool("As shown in (a), the answer is 4.") is None
    assert parse_tool("see figure(3)") is None


def test_thinking_models():
    closed = "<think>Maybe ```bash\nrm -rf /\n``` no.</think>\n\n```bash\nls\n```"
    assert parse_tool(closed) == "ls"
    qwen3 = 'The user wants weather.</think><tool_call>{"name": "get_weather", "arguments": {}}</tool_call>'
    assert parse_tool(qwen3) == "get_weather"  # template put <think> in the prompt
    assert parse_tool("<think>I will call get_weather(city='Paris') next") is None  # not answered yet
    assert parse_tool('<think>{"name": "x", "arguments": {}}') is None
    assert parse_tool("<think>a</think>The answer is 42.") is None
    assert parse_tool("<think>one</think><think>two</think>```bash\ncat a\n```") == "cat"


def test_hint_wins():
    assert parse_tool("```bash\nls\n```", hint="pytest") == "pytest"
    assert parse_tool(None, hint=" web_search ") == "web_search"
    assert parse_tool("```bash\nls\n```", hint="") == "ls"
    assert parse_tool("```bash\nls\n```", hint=3) == "ls"


@pytest.mark.parametrize("junk", [
    None, "", "   \n", 42, 3.5, [], {}, object(), b"\x00\xff\xfe garbage \x80",
    bytearray(b"```bash\nls\n```"), "{not json", '{"tool_calls": [{"function": {"name": 7}}]}',
    '{"tool_calls": "oops"}', "```", "``````", "```bash", "```bash\n", "<tool_call>{broken</tool_call>",
    "<tool_call></tool_call>", "[" * 5000, "{" * 5000, '{"name": "' + "x" * 500 + '", "arguments": {}}',
    "\ud800 lone surrogate", "<think>", "</think>", "<|python_tag|>",
])
def test_garbage_never_raises(junk):
    result = parse_tool(junk)
    assert result is None or isinstance(result, str)
    assert parse_tool_from_message(junk) is None or isinstance(parse_tool_from_message(junk), str)


def test_bytes_are_decoded():
    assert parse_tool(b"```bash\nls\n```") == "ls"
    assert parse_tool(b"\x00\xff\xfe garbage") is None


def test_huge_inputs_are_fast():
    for big in ("a" * (1 << 20), "{" * (1 << 20), "[" * (1 << 20), "```" * 350_000, '{"a": ' * 200_000,
                "<tool_call>" * 100_000, "(" * (1 << 20), "x(" * 500_000):
        t = time.perf_counter()
        assert parse_tool(big) is None
        assert time.perf_counter() - t < 2.0
    # a real call after a long preamble is still found
    assert parse_tool("x " * 500_000 + "\n```bash\npytest\n```") == "pytest"


def test_message_dicts():
    assert parse_tool_from_message({"role": "assistant", "content": "```bash\nls\n```"}) == "ls"
    parts = {"role": "assistant", "content": [{"type": "text", "text": "Let me check."},
                                              {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}}]}
    assert parse_tool_from_message(parts) == "Bash"
    assert parse_tool_from_message({"role": "assistant", "content": [{"type": "text", "text": "```bash\ngit diff\n```"}]}) == "git"
    assert parse_tool_from_message({"role": "assistant", "tool_calls": [{"function": None}], "content": None}) is None
    assert parse_tool_from_message({"role": "assistant", "content": "All done."}) is None


def test_stdlib_only():
    import importlib
    import subprocess
    code = "import sys, traces.toolparse; bad = [m for m in ('numpy', 'simpy', 'vllm', 'pandas') if m in sys.modules]; print(bad)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"
    assert importlib.import_module("traces.toolparse")
