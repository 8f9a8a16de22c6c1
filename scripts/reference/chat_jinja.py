"""Chat templates rendered by jinja2 as llama-cpp-python renders a GGUF file's template, as test
data for tessera's minijinja rendering.

The templates are written here to use what model templates use from jinja2 and Python: string
and dict methods (strip, split, startswith ...), namespace(), loop variables, `is string`, tests
on `tools` (which llama-cpp-python passes as None) and raise_exception. The environment is
llama-cpp-python 0.3.36's (Jinja2ChatFormatter): a sandbox with trim_blocks, lstrip_blocks and
loop controls. Writes llm/tests/data/tokenizer/chat_jinja.json.

Run with llama-cpp-python's Python (for its jinja2):  python scripts/reference/chat_jinja.py OUT.json
"""

import json
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

TEMPLATES = {
    "methods": (
        "{%- for m in messages -%}\n"
        "[{{ m.role.upper() }}|{{ m['content'].strip() }}|{{ m.content.lstrip('\\n ') }}"
        "|{{ m.content.rstrip() }}|{{ m.content.strip(' \\nH') }}"
        "|{% if m.content.startswith('<think>') %}T{% else %}F{% endif %}"
        "|{% if m.content.endswith(('!', '?')) %}T{% else %}F{% endif %}"
        "|{{ m.content.split('</think>')[-1].strip() }}|{{ m.content.split() | join(',') }}"
        "|{{ m.content.split(None, 1) | join('/') }}|{{ m.content.split(' ', 2) | join('/') }}"
        "|{{ m.content.replace('a', 'A', 1) }}|{{ m.content.replace('a', '4') }}"
        "|{{ m.content.find('\u00e9') }}|{{ m.content.count('a') }}"
        "|{{ '-'.join(['x', m.role]) }}|{{ m.role.title() }}|{{ m.role.capitalize() }}"
        "|{{ m.get('name', 'anon') }}|{{ m.get('role') }}|{{ m.keys() | list | length }}"
        "|{% for k, v in m.items() %}{{ k }}{% endfor %}]\n"
        "{% endfor -%}"
    ),
    "think": (
        "{%- set ns = namespace(last_user=0) -%}\n"
        "{%- for m in messages -%}\n"
        "  {%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}\n"
        "{%- endfor -%}\n"
        "{%- for m in messages -%}\n"
        "  {%- if m.role == 'assistant' and '</think>' in m.content -%}\n"
        "    {%- set content = m.content.split('</think>')[-1].lstrip('\\n') -%}\n"
        "    {%- set reasoning = m.content.split('</think>')[0].rstrip('\\n')"
        ".split('<think>')[-1].lstrip('\\n') -%}\n"
        "  {%- else -%}\n"
        "    {%- set content = m.content -%}\n"
        "    {%- set reasoning = '' -%}\n"
        "  {%- endif -%}\n"
        "  {{- '<|im_start|>' + m.role + '\\n' -}}\n"
        "  {%- if reasoning and loop.index0 < ns.last_user -%}\n"
        "    {{- '<think>\\n' + reasoning + '\\n</think>\\n\\n' -}}\n"
        "  {%- endif -%}\n"
        "  {{- content + '<|im_end|>\\n' -}}\n"
        "{%- endfor -%}\n"
        "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
    ),
    "blocks": (
        "{{ bos_token }}{% if tools %}TOOLS{% endif %}{% if tools is none %}no tools{% endif %}\n"
        "{% for m in messages %}\n"
        "    {% if m.content is string %}\n"
        "{{ m.role }}: {{ m.content | trim }}\n"
        "    {% endif %}\n"
        "    {% if loop.first %}{% continue %}{% endif %}\n"
        "({{ loop.index }}/{{ loop.length }})\n"
        "{% endfor %}\n"
        "{% if add_generation_prompt %}assistant:{% endif %}{{ eos_token }}"
    ),
    "rejects_system": (
        "{% if messages[0]['role'] == 'system' %}"
        "{{ raise_exception('System role not supported') }}{% endif %}"
        "{% for m in messages %}{{ m.content }}{% endfor %}"
    ),
}

CONVERSATION = [
    ("system", "You are helpful.  "),
    ("user", "  Hello a\n"),
    ("assistant", "<think>\nplan a\n</think>\n\nHi a!"),
    ("user", "Why \u00e9? na\u00efve a a "),
]


def render(template, add_generation_prompt):
    env = ImmutableSandboxedEnvironment(
        loader=jinja2.BaseLoader(),
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[jinja2.ext.loopcontrols],
    )

    def raise_exception(message):
        raise ValueError(message)

    messages = [{"role": r, "content": c} for r, c in CONVERSATION]
    try:
        return env.from_string(template).render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token="<s>",
            eos_token="</s>",
            raise_exception=raise_exception,
            tools=None,
            tool_choice=None,
            functions=None,
            function_call=None,
        )
    except ValueError as e:
        return {"error": str(e)}


def main(out_path):
    data = {
        "made_with": f"jinja2 {jinja2.__version__}, configured as llama-cpp-python 0.3.36",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "conversation": CONVERSATION,
        "templates": {
            name: {"template": t, "render": render(t, False), "render_gen": render(t, True)}
            for name, t in TEMPLATES.items()
        },
    }
    with open(out_path, "w") as f:
        json.dump(data, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1])
