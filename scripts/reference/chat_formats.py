"""llama.cpp's built-in chat formats and its template detection, as test data for tessera.

Renders a few conversations with each built-in format llama.cpp names (llm_chat_apply_template
through the C API's llama_chat_apply_template, which takes a format name or a template string),
and finds which format llama.cpp detects for some template strings by rendering them too.
Writes llm/tests/data/tokenizer/chat_formats.json.

Run with llama-cpp-python 0.3.36:  python scripts/reference/chat_formats.py OUT.json
"""

import ctypes
import json
import sys

import llama_cpp

FORMATS = [
    "chatml", "gemma", "llama3", "phi3", "granite", "llama2", "llama2-sys", "llama2-sys-bos",
    "llama2-sys-strip", "granite-4.0", "mistral-v1", "mistral-v3", "mistral-v3-tekken", "mistral-v7",
    "gpt-oss",
]

CONVERSATIONS = {
    "user": [("user", "What is the capital of France?")],
    "multi": [
        ("system", "  You are a terse assistant. "),
        ("user", "Say hi.\n"),
        ("assistant", " Hi. "),
        ("user", "Now in French, with an accent: é?"),
    ],
    "two_systems": [("system", "A"), ("system", "B"), ("user", "x"), ("assistant", "y")],
    "tool_call": [("user", "x"), ("assistant_tool_call", "f()")],
}

# Template strings, each with the substrings llama.cpp's detection looks for.
TEMPLATES = {
    "qwen": "{% for m in messages %}{{'<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n'}}{% endfor %}",
    "gemma": "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}{% endfor %}",
    "llama3": "{{ bos_token }}<|start_header_id|>{{ role }}<|end_header_id|>\\n\\n{{ content }}<|eot_id|>",
    "phi3": "{{'<|user|>\\n' + message['content'] + '<|end|>\\n'}}{{ '<|assistant|>\\n' }}",
    "granite": "<|start_of_role|>{{ message['role'] }}<|end_of_role|>{{ message['content'] }}<|end_of_text|>",
    "llama2": "{{ '[INST] ' + content + ' [/INST]' }}",
    "llama2_sys": "{{ '<<SYS>>\\n' + system + '\\n<</SYS>>\\n\\n' }}[INST]",
    "llama2_strip": "[INST] <<SYS>>{{ content.strip() }}",
    "llama2_bos": "<<SYS>>{{ bos_token + '[INST] ' }}",
    "mistral_v1": "{{ ' [INST] ' + system_message }} [INST]",
    "mistral_v3": "[AVAILABLE_TOOLS][INST]",
    "mistral_v3_tekken": "[AVAILABLE_TOOLS]{{ \"[INST]\" }}",
    "mistral_v7": "[SYSTEM_PROMPT][INST]",
    "phi4": "<|im_start|>{{ m['role'] }}<|im_sep|>{{ m['content'] }}<|im_end|>",
    "granite4": "<|start_of_role|>{{ m['role'] }}<|end_of_role|><tools>",
    "zephyr": "<|user|>{{ content }}<|endoftext|>",
    "gpt_oss": "<|start|>{{ m['role'] }}<|channel|>final<|message|>{{ m['content'] }}<|end|>",
    "unknown": "{% for m in messages %}{{ m['content'] }}{% endfor %}",
}


def render(tmpl: str, conv, add_ass: bool):
    msgs = (llama_cpp.llama_chat_message * len(conv))()
    keep = []
    for i, (role, content) in enumerate(conv):
        r, c = role.encode(), content.encode()
        keep += [r, c]
        msgs[i].role = r
        msgs[i].content = c
    size = 1 << 16
    buf = ctypes.create_string_buffer(size)
    n = llama_cpp.llama_chat_apply_template(tmpl.encode(), msgs, len(conv), add_ass, buf, size)
    if n < 0:
        return None
    assert n < size
    return buf.raw[:n].decode()


def main(out_path: str) -> None:
    def all_renders(tmpl):
        return {
            f"{conv}{'_gen' if add_ass else ''}": render(tmpl, msgs, add_ass)
            for conv, msgs in CONVERSATIONS.items()
            for add_ass in (True, False)
        }

    renders = {name: all_renders(name) for name in FORMATS}
    detect = {}
    for key, tmpl in TEMPLATES.items():
        got = all_renders(tmpl)
        names = [n for n in FORMATS if renders[n] == got]
        got = got["multi_gen"]
        assert len(names) <= 1, (key, got, names)
        # None: llama.cpp detects nothing; "other": a format it knows that is not listed here.
        fmt = None if got is None else names[0] if names else "other"
        detect[key] = {"template": tmpl, "format": fmt}
    data = {
        "made_with": f"llama-cpp-python {llama_cpp.__version__} (llama_chat_apply_template)",
        "conversations": CONVERSATIONS,
        "renders": renders,
        "detect": detect,
    }
    with open(out_path, "w") as f:
        json.dump(data, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1])
