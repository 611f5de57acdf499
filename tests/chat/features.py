"""Generic Jinja templates for tests/chat/compare.py: each exercises a part of
the subset formats/jinja.c implements; both engines render them over the
same message lists. "errors" templates must fail in both."""

MSGS = [
    {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "héllo"},
                  {"role": "assistant", "content": "ok"}, {"role": "user", "content": "again"}],
     "add_generation_prompt": True},
    {"messages": [{"role": "user", "content": "only"}], "add_generation_prompt": False},
    {"messages": [], "add_generation_prompt": True},
]

FEATURES = {
    "whitespace": "a  {% if true %}\n  b\n  {% endif %}\nc {{- ' d ' -}} e\n  {# comment #}\n  f{%+ if true %}g{% endif +%}\nh\n"
                  "\t{%- if true -%}\n  i  \n{%- endif %}\n   {% for m in messages %}\n   [{{ m.role }}]\n   {% endfor %}\nend\n\n",
    "crlf": "x\r\n{% if true %}\r\ny\r\n{% endif %}\r\nz {{ 'a\r\nb' }}\r\n",
    "loops": "{% for m in messages %}{{ loop.index }}/{{ loop.length }}:{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}"
             "{{ ',' if not loop.last }}{% if loop.first %}F{% endif %}{{ loop.previtem.role if loop.previtem is defined }}"
             "{{ loop.cycle('x', 'y') }}{% else %}empty{% endfor %}",
    "filters": "{{ messages|length }} {{ 'AbC'|lower }} {{ 'abc'|upper }} {{ ' x '|trim }} {{ 'xxyxx'|trim('x') }} "
               "{{ [3,1,2]|join('-') }} {{ [1,2,3]|first }} {{ [1,2,3]|last }} {{ 'x'|default('y') }} "
               "{{ undefined_var|default('dflt') }} {{ ''|default('e', true) }} {{ 1.5|int }} {{ '3'|int + 1 }} {{ 'x'|int }} "
               "{{ -3|abs }} {{ 2.5|round }} {{ 3.14159|round(2) }} {{ 'a b c'|replace(' ', '_') }} "
               "{{ [1,2,2,3]|unique|list }} {{ [1,2]|reverse|list }} {{ 'abc'|reverse }} "
               "{% for k, v in {'b':1,'a':2}|dictsort %}{{ k }}={{ v }};{% endfor %} "
               "{% for k, v in {'a':1}|items %}{{ k }}{{ v }}{% endfor %} {{ [1,2,3]|sum }} {{ [1,5,3]|max }} {{ [4,2]|min }} "
               "{{ 'hello world'|title }} {{ 'hello'|capitalize }} {{ 'a\nb'|indent(2, true) }} {{ 'a\n\nb'|indent }} "
               "{{ 'x y  z'|wordcount }} {{ 42|string ~ '!' }} {{ '<&>'|e }} {{ '<b>'|safe }} {{ 3|float }} "
               "{{ messages|map(attribute='role')|join(',') }} {{ messages|selectattr('role', 'equalto', 'user')|list|length }} "
               "{{ messages|rejectattr('role', 'eq', 'user')|map(attribute='content')|list }} {{ [1,0,2]|select|list }} "
               "{{ [1,2,3,4]|select('odd')|list }} {{ [1,2,3]|reject('even')|list }} {{ ['a','b']|map('upper')|list }} "
               "{{ 'abc'|list }} {{ messages|map(attribute='name', default='-')|list }} {{ [[1],[2]]|sum(start=[]) }}",
    "strings": "{{ 'a,b,,c'.split(',') }} {{ '  a  b '.split() }} {{ 'a b c'.rsplit(' ', 1) }} {{ 'a b c'.split(' ', 1) }} "
               "{{ ' x y '.rsplit() }} {{ 'xxhixx'.strip('x') }} {{ '\u3000 wide \u00a0'.strip() }}|{{ 'ab  '.rstrip() }}|{{ '  ab'.lstrip() }}| "
               "{{ 'hello'.startswith('he') }} {{ 'hello'.endswith(('lo','x')) }} {{ 'Hello'[1:3] }} {{ 'héllo'[1] }} "
               "{{ 'abc'[::-1] }} {{ 'héllo'|length }} {{ 'a-b'.replace('-', '+') }} {{ 'aaa'.replace('a', 'b', 2) }} "
               "{{ 'abcabc'.find('c') }} {{ 'abcabc'.count('b') }} {{ ','.join(['x','y']) }} {{ 'abc' ~ 1 ~ none }} "
               "{{ 'x' * 3 }} {{ 'Hi There'.lower() }} {{ 'hi'.upper() }} {{ 'l1\nl2\r\nl3'.splitlines() }} "
               "{{ '12'.isdigit() }} {{ 'é'[0:1] }} {{ 'x\\'y' }} {{ \"it's\" }} {{ 'q\"' }} {{ ['it\\'s', 'a\"b'] }} "
               "{{ 'tab\\there' }} {{ '\\u00e9\\x41\\101' }} {{ 'a' 'b' }} {{ 'back\\\\slash \\d' }}",
    "ops": "{{ 1 + 2 * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 2 ** -1 }} "
           "{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 1 == 1.0 }} {{ 'a' in 'cat' }} {{ 3 not in [1,2] }} {{ not true or false }} "
           "{{ true and 'x' }} {{ none or 'y' }} {{ 'yes' if 1 > 2 else 'no' }} {{ [1] + [2] }} {{ 0.1 + 0.2 }} "
           "{{ 1e20 }} {{ 1e-7 }} {{ 1.0 }} {{ 10 / 4 }} {{ 100.0 * 3 }} {{ 1_000 }} {{ -0.0 }} {{ 3 is odd }} {{ 4 is divisibleby 2 }} "
           "{{ none is none }} {{ x is defined }} {{ x is undefined }} {{ 'a' is string }} {{ 1 is number }} "
           "{{ 1.5 is float }} {{ true is boolean }} {{ {} is mapping }} {{ [1] is sequence }} {{ 1 is in [1,2] }} "
           "{{ 2 is eq 2 }} {{ 'abc' is lower }} {{ (1, 2) }} {{ {'a': 1, 'b': none} }} {{ none }} {{ true }} "
           "{{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 5 is ge 5 }} {{ 'x' if false }}| {{ -(3) }} {{ +4 }} {{ 2 * 'ab' }}",
    "scopes": "{%- set ns = namespace(n=0, s='') %}"
              "{%- for m in messages %}{% set ns.n = ns.n + 1 %}{% set ns.s = ns.s + m.role[0] %}{% endfor %}"
              "{{- ns.n }} {{ ns.s }}"
              "{%- set x = 1 %}{% for i in range(3) %}{% set x = i %}{% endfor %} x={{ x }}"
              "{%- macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}\n"
              "{{ greet('a') }} {{ greet('b', punct='?') }} {{ greet(name='c') }}"
              "{%- macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}\n"
              "{% call wrap('p') %}inside {{ ns.n }}{% endcall %}"
              "{%- macro rec(n) %}{{ n }}{% if n > 0 %}{{ rec(n - 1) }}{% endif %}{% endmacro %} {{ rec(3) }}"
              "{%- set block %}  captured {{ 1 + 1 }}  {% endset %}\n|{{ block }}|"
              "{%- for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %}"
              "{%- for k, v in {'a': 1, 'b': 2}.items() %} {{ k }}={{ v }}{% endfor %}"
              "{%- for m in messages if m.role == 'user' %} u{{ loop.index }}{% endfor %}"
              "{%- if messages %} {{ messages[0]['role'] }} {{ messages[-1].role }} {{ (messages|length) }}{% endif %}"
              " {{ {'a': [1, 2]}['a'][1] }} {{ [1, 2, 3][1:] }} {{ [1, 2, 3][:-1] }} {{ dict(a=1).a }} {{ range(2, 8, 3)|list }}"
              "{%- for a, b in [[1, 2], [3, 4]] %} {{ a + b }}{% endfor %}"
              "{%- for i in range(2) %}{% for j in range(2) %} {{ loop.index }}{{ i }}{% endfor %}{% endfor %}"
              " {{ {'k': 1}.get('k') }} {{ {'k': 1}.get('z', 'd') }} {{ {'k': 1}.keys()|list }} {{ {'k': 1}.values()|list }}"
              "{% if messages|length > 1 %} many{% elif messages %} one{% else %} none{% endif %}",
    "tojson": "{{ messages|tojson }} {{ {'b': 1, 'a': [1.5, none, true, 'x\\ny']}|tojson(indent=2) }} "
              "{{ 'ü😀'|tojson(ensure_ascii=True) }} {{ {'z':1,'a':2}|tojson(sort_keys=true) }} "
              "{{ [1,2,{'a':[]}]|tojson(separators=[',', ':']) }} {{ {}|tojson }} {{ []|tojson(indent=4) }} "
              "{{ 'tab\\t\\u0001 \"q\" \\\\'|tojson }} {{ 1e300|tojson }} {{ 0.000123|tojson }}",
    "chatml_mkmodel": "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
                      "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
    "bos_generation": "{{- bos_token }}{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{{ eos_token }}{% endgeneration %}"
                      "{% else %}[{{ m.role|upper }}] {{ m.content|trim }}\n{% endif %}{% endfor %}"
                      "{%- if add_generation_prompt %}<assistant>{% endif %}",
}

# Templates both engines must refuse (at compile or render time).
ERRORS = {
    "raise": "{% if messages|length < 5 %}{{ raise_exception('Need 5 messages, got ' ~ messages|length) }}{% endif %}x",
    "syntax_for": "{% for %}{% endfor %}",
    "unclosed_if": "{% if true %}x",
    "unclosed_tag": "{{ 1 + ",
    "stray_endif": "x{% endif %}",
    "undefined_attr": "{{ nothing.attr }}",
    "div_zero": "{{ 1 / 0 }}",
    "sandbox_append": "{% set l = [] %}{{ l.append(1) }}",
    "bad_unpack": "{% for a, b in [[1, 2, 3]] %}{% endfor %}",
    "undef_plus": "{{ nothing + 1 }}",
    "not_callable": "{{ 'x'() }}",
    "bad_filter": "{{ 1|nosuchfilter }}",
    "unterminated_string": "{{ 'abc }}",
    "none_iter": "{% for x in none %}{% endfor %}",
    "order_mixed": "{{ 1 < 'a' }}",
    "break_outside": "{% break %}",
    "macro_bad_kwarg": "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, b=2) }}",
    "macro_too_many": "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}",
}
