// The Jinja engine (server/jinja) on its own: expressions, filters, tests, whitespace control,
// loops, macros, scoping, undefined values and errors with their lines. The expected outputs
// are what jinja2 3.1 renders in HF transformers' environment (checked when the cases were
// written; tests/chat_templates/ compares whole model templates against jinja2 at test time).
#include <catch2/catch.hpp>
#include <string>

#include "nlohmann/json.hpp"
#include "server/jinja/json.h"
#include "server/jinja/template.h"

namespace thermocline::server::jinja {
namespace {

// A fixed clock for strftime_now: 2023-11-14 22:13:20 UTC.
constexpr std::time_t kNow = 1700000000;

absl::StatusOr<std::string> Try(const std::string& source, const nlohmann::ordered_json& vars =
                                                               nlohmann::ordered_json::object()) {
  auto t = Template::Parse(source);
  if (!t.ok()) return t.status();
  Template::Variables v;
  for (const auto& [k, value] : vars.items()) v.emplace_back(k, FromJson(value));
  return t->Render(v, kNow);
}

std::string Render(const std::string& source,
                   const nlohmann::ordered_json& vars = nlohmann::ordered_json::object()) {
  auto r = Try(source, vars);
  INFO(source);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  return *r;
}

std::string Error(const std::string& source,
                  const nlohmann::ordered_json& vars = nlohmann::ordered_json::object()) {
  auto r = Try(source, vars);
  INFO(source);
  REQUIRE(!r.ok());
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  return std::string(r.status().message());
}

}  // namespace

TEST_CASE("jinja: literals and printing follow Python's str()", "[server][jinja]") {
  CHECK(Render("{{ none }}|{{ None }}|{{ true }}|{{ False }}") == "None|None|True|False");
  CHECK(Render("{{ 1.0 }} {{ 1e20 }} {{ 1e-5 }} {{ 0.1 + 0.2 }} {{ 1e16 }} {{ -0.0 }} {{ 1/3 }}") ==
        "1.0 1e+20 1e-05 0.30000000000000004 1e+16 -0.0 0.3333333333333333");
  CHECK(Render("{{ [1, 'a', none, true, 1.5] }} {{ {'a': 1} }} {{ (1, 2) }} {{ (1,) }}") ==
        "[1, 'a', None, True, 1.5] {'a': 1} (1, 2) (1,)");
  CHECK(Render(R"({{ ["it's", 'a"b', 'x\ny'] }})") == R"(["it's", 'a"b', 'x\ny'])");
  CHECK(Render(R"({{ 'a' 'b' }} {{ '\u00e9\x41\101' }} {{ "tab\there" }})") == "ab éAA tab\there");
}

TEST_CASE("jinja: operators have Python's meaning and jinja2's precedence", "[server][jinja]") {
  CHECK(Render("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 / 2 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 4 / 2 }}") ==
        "3 -4 3.5 2 1024 2.0");
  CHECK(Render("{{ [1] + [2] }} {{ 'x' * 3 }} {{ [1] * 2 }} {{ 'a' ~ 1 ~ none }}") ==
        "[1, 2] xxx [1, 1] a1None");
  CHECK(Render("{{ 1 == 1.0 }} {{ true == 1 }} {{ (1, 2) == [1, 2] }} {{ [1, 2] < [1, 3] }}") ==
        "True True False True");
  CHECK(Render("{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 'x' in 'xyz' }} {{ 1 not in [2] }}") ==
        "True False True True");
  CHECK(Render("{{ 1 and 'b' }} {{ 0 or 'c' }} {{ not 0 }} {{ true and false or 'x' }}") ==
        "b c True x");
  CHECK(Render("{{ -2 ** 2 }} {{ 2 * 3 + 4 }} {{ 'a' ~ 2 * 3 }} {{ 1 if true else 2 }}") ==
        "4 10 a6 1");
  CHECK(Render("{{ 'a' if false }}|{{ 'abc'[::-1] }} {{ [1, 2, 3][1:] }} {{ 'abc'[-2:] }}") ==
        "|cba [2, 3] bc");
  CHECK(Render("{{ '%s and %d' % ('a', 3) }} {{ '{} {name}'.format(1, name='n') }}") ==
        "a and 3 1 n");
  CHECK(Error("{{ 'a' + 1 }}") == "line 1: can only concatenate str (not \"int\") to str");
  CHECK(Error("{{ 1 / 0 }}") == "line 1: division by zero");
}

TEST_CASE("jinja: undefined behaves as jinja2's default Undefined", "[server][jinja]") {
  // Printing, iterating, length and concatenation are fine ...
  CHECK(Render("[{{ x }}]{% for i in x %}no{% endfor %}{{ x | length }}{{ x ~ 'a' }}") == "[]0a");
  CHECK(Render("{{ x is defined }} {{ x is undefined }} {{ x | default('d') }} {{ d.y }}|",
               {{"d", {{"a", 1}}}}) == "False True d |");
  CHECK(Render("{{ x == y }} {{ x == none }} {{ x is iterable }} {{ not x }}") ==
        "True False True True");
  // ... anything else is an error naming what was undefined.
  CHECK(Error("{{ x.y }}") == "line 1: 'x' is undefined");
  CHECK(Error("{{ d.y.z }}", {{"d", {{"a", 1}}}}) == "line 1: 'dict object' has no attribute 'y'");
  CHECK(Error("{{ x + 1 }}") == "line 1: 'x' is undefined");
  CHECK(Error("{{ x() }}") == "line 1: 'x' is undefined");
  CHECK(Error("{{ x | tojson }}") == "line 1: Object of type Undefined is not JSON serializable");
  CHECK(Error("{{ m[5].role }}", {{"m", {1}}}) == "line 1: list object has no element 5");
}

TEST_CASE("jinja: whitespace control matches trim_blocks and lstrip_blocks", "[server][jinja]") {
  // lstrip_blocks drops the indentation of a block tag alone on its line, trim_blocks the
  // newline after it; variable tags keep both.
  CHECK(Render("  {% if true %}\n  x\n  {% endif %}\n  y  {% if 1 %}z{% endif %}\n") ==
        "  x\n  y  z");
  CHECK(Render("{# c #}\n  {#- c2 -#}  w") == "w");
  CHECK(Render("a\n    {%- if true -%}\n  b  \n{%- endif %}\nc\n\n") == "abc\n");
  CHECK(Render("{{- ' x ' -}}\n  {%+ if true %}k{% endif +%}\nq") == " x k\nq");
  CHECK(Render("  {{ 'v' }}\n") == "  v");
  // One trailing newline is dropped; \r\n is read as \n.
  CHECK(Render("a\r\nb\r\n") == "a\nb");
  CHECK(Render("{% raw %}{{ x }}{% endraw %}|{%- raw -%}  {% y %}  {%- endraw %}|") ==
        "{{ x }}|{% y %}|");
}

TEST_CASE("jinja: loops, loop variables and scoping", "[server][jinja]") {
  const nlohmann::ordered_json ms = {
      {"ms", {{{"r", "u"}, {"c", "a"}}, {{"r", "s"}, {"c", "b"}}, {{"r", "u"}, {"c", "c"}}}}};
  CHECK(Render("{% for m in ms if m.r == 'u' %}{{ loop.index }}/{{ loop.length }}:{{ m.c }}"
               "{{ ',' if not loop.last }}{% endfor %}",
               ms) == "1/2:a,2/2:c");
  CHECK(Render("{% for x in ['a','b','c'] %}{{ loop.index0 }}{{ loop.revindex }}{{ loop.first }}"
               "{{ loop.previtem }}{{ loop.nextitem }}{{ loop.cycle('o','e') }}|{% endfor %}") ==
        "03Truebo|12Falseace|21Falsebo|");
  CHECK(Render("{% for x in [] %}a{% else %}b{% endfor %}") == "b");
  CHECK(Render("{% for x in [1,2,3,4] %}{% if x == 2 %}{% continue %}{% endif %}"
               "{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}") == "13");
  CHECK(Render("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}",
               {{"d", {{"z", 1}, {"a", {1, 2}}}}}) == "z=1;a=[1, 2];");
  CHECK(Render("{% for n in t recursive %}<{{ n.name }}{% if n.kids %}:{{ loop(n.kids) }}"
               "{% endif %}>{% endfor %}",
               {{"t",
                 {{{"name", "a"},
                   {"kids", {{{"name", "b"}, {"kids", nlohmann::ordered_json::array()}}}}},
                  {{"name", "c"}}}}}) == "<a:<b>><c>");
  // A set inside a loop body is local to the iteration; an if does not scope.
  CHECK(Render("{% set x = 0 %}{% for i in [1,2] %}[{{ x }}]{% set x = i %}({{ x }})"
               "{% endfor %}{{ x }}") == "[0](1)[0](2)0");
  CHECK(Render("{% if true %}{% set z = 3 %}{% endif %}{{ z }}") == "3");
  // namespace() carries values out of a loop.
  CHECK(Render("{% set ns = namespace(a=1) %}{% for i in range(3) %}{% set ns.a = ns.a + i %}"
               "{% endfor %}{{ ns.a }}") == "4");
  CHECK(Error("{% set s = 'x' %}{% set s.a = 1 %}") ==
        "line 1: cannot assign attribute on non-namespace object");
}

TEST_CASE("jinja: macros, call blocks, set blocks and filter blocks", "[server][jinja]") {
  CHECK(Render("{% macro f(a, b=2) %}{{ a }}-{{ b }}{% endmacro %}{{ f(1) }} {{ f(1, 3) }} "
               "{{ f(b=5, a=0) }}") == "1-2 1-3 0-5");
  CHECK(Render("{% macro m(a) %}{{ a }}|{{ varargs }}|{{ kwargs }}{% endmacro %}"
               "{{ m(1, 2, 3, x=4) }}") == "1|(2, 3)|{'x': 4}");
  // Macros see the template's variables at call time and may recurse.
  CHECK(Render("{% macro m() %}{{ x }}{% endmacro %}{% set x = 7 %}{{ m() }}") == "7");
  CHECK(Render("{%- macro j(s) -%}{%- if s.type == 'array' -%}list[{{ j(s['items']) }}]"
               "{%- else -%}{{ s.type }}{%- endif -%}{%- endmacro -%}{{ j(x) }}",
               {{"x", {{"type", "array"}, {"items", {{"type", "string"}}}}}}) == "list[string]");
  CHECK(Render("{% macro f(x) %}[{{ caller(x) }}]{% endmacro %}"
               "{% call(y) f(3) %}got {{ y }}{% endcall %}") == "[got 3]");
  CHECK(Render("{% set x %}inner {{ 1 + 1 }}{% endset %}[{{ x }}]{% set y | upper %}abc"
               "{% endset %}{{ y }}") == "[inner 2]ABC");
  CHECK(Render("{% filter upper %}hello {{ 'w' }}{% endfilter %}") == "HELLO W");
  CHECK(Render("{% generation %}gen {{ 1 }}{% endgeneration %}") == "gen 1");
}

TEST_CASE("jinja: filters", "[server][jinja]") {
  CHECK(Render("{{ 'Hello World' | lower }} {{ 'hello world'|title }} {{ 'hELLO'|capitalize }} "
               "{{ '  x  '|trim }} {{ 'a-b'|replace('-', '+') }} {{ 'abc'|upper }}") ==
        "hello world Hello World Hello x a+b ABC");
  CHECK(
      Render("{{ [3,1,2]|sort }} {{ [3,1,2]|sort(reverse=true) }} {{ ['b','A','a']|unique|list }}"
             " {{ [1,2,3]|sum }} {{ [1,2,3]|first }} {{ [1,2,3]|last }} {{ [1,2,3]|join(',') }}") ==
      "[1, 2, 3] [3, 2, 1] ['b', 'A'] 6 1 3 1,2,3");
  CHECK(Render("{{ d|dictsort }} {{ d|items|list }} {{ d.keys()|list }} {{ d.get('z', 9) }}",
               {{"d", {{"b", 2}, {"a", 1}}}}) ==
        "[('a', 1), ('b', 2)] [('b', 2), ('a', 1)] "
        "['b', 'a'] 9");
  const nlohmann::ordered_json ms = {{"ms", {{{"r", "u"}, {"c", "a"}}, {{"r", "s"}, {"c", "b"}}}}};
  CHECK(Render("{{ ms|selectattr('r', 'equalto', 'u')|map(attribute='c')|list }} "
               "{{ ms|rejectattr('r', 'eq', 'u')|map(attribute='c')|join }} "
               "{{ [0,1,2]|select|list }} {{ [1,2,3]|reject('odd')|list }}",
               ms) == "['a'] b [1, 2] [2]");
  CHECK(
      Render("{{ 'hello'|indent(2) }}|{{ 'a\nb\n\nc'|indent(2) }}|{{ 'a\nb'|indent(2, true) }}") ==
      "hello|a\n  b\n\n  c|  a\n  b");
  CHECK(Render("{{ '3.7'|int }} {{ 'x'|int(5) }} {{ 3.9|int }} {{ '2'|float }} {{ 2.5|round }} "
               "{{ 3.14159|round(2) }} {{ 2.5|round(0, 'ceil') }} {{ -3|abs }}") ==
        "3 5 3 2.0 2.0 3.14 3.0 3");
  CHECK(
      Render("{{ x|default('d') }}{{ ''|default('e', true) }}{{ none|default('n') }}"
             "{{ none|string }} {{ 'one two'|wordcount }} {{ [1,5,3]|max }} {{ 'abc'|reverse }}") ==
      "deNoneNone 2 5 cba");
  CHECK(Render("{{ 'hello world how are you'|truncate(9) }}|{{ [1,2,3,4,5]|batch(2)|list }}") ==
        "hello...|[[1, 2], [3, 4], [5]]");
  CHECK(Error("{{ x | nosuch }}") == "line 1: no filter named 'nosuch'");
}

TEST_CASE("jinja: tojson is json.dumps with ensure_ascii off", "[server][jinja]") {
  CHECK(Render("{{ {'a': 'é\"', 'b': [1, 2.5, none, true]} | tojson }}") ==
        R"({"a": "é\"", "b": [1, 2.5, null, true]})");
  CHECK(Render("{{ {'a': {'b': 1}, 'c': []} | tojson(indent=2) }}") ==
        "{\n  \"a\": {\n    \"b\": 1\n  },\n  \"c\": []\n}");
  CHECK(Render("{{ 'é' | tojson(ensure_ascii=true) }} {{ {'b':1,'a':2} | tojson(sort_keys=true) }} "
               "{{ {'k': 'v'} | tojson(separators=[',', ':']) }} {{ 'a\\u0001' | tojson }}") ==
        R"("\u00e9" {"a": 2, "b": 1} {"k":"v"} "a\u0001")");
  // Key order is the order the value was built in.
  CHECK(Render("{{ t | tojson }}", {{"t", {{"z", 1}, {"a", 2}}}}) == R"({"z": 1, "a": 2})");
}

TEST_CASE("jinja: tests and Python methods", "[server][jinja]") {
  CHECK(
      Render("{{ none is none }} {{ 1 is number }} {{ true is number }} {{ 'a' is string }} "
             "{{ {} is mapping }} {{ [] is iterable }} {{ 'a' is sequence }} {{ 3 is odd }} "
             "{{ 4 is divisibleby 2 }} {{ 1 is integer }} {{ 1.0 is float }} {{ true is boolean }}"
             " {{ 1 is in [1,2] }} {{ 'a' is lower }} {{ 3 is gt 2 }}") ==
      "True True True True True True True True True True True True True True True");
  CHECK(Render("{{ 'a b  c'.split() }} {{ 'a,b'.split(',') }} {{ 'xxhixx'.strip('x') }} "
               "{{ 'abc'.startswith('a') }} {{ 'abc'.endswith(('x','c')) }} "
               "{{ 'a</think>b'.split('</think>')[-1] }} {{ \"they're\".title() }}") ==
        "['a', 'b', 'c'] ['a', 'b'] hi True True b They'Re");
  CHECK(Render("{{ 'héllo'|length }} {{ 'héllo'[1] }} {{ 'héllo'|upper }} {{ 'straße'|upper }}") ==
        "5 é HÉLLO STRASSE");
  // The immutable sandbox refuses mutating methods.
  CHECK(Error("{% set l = [1] %}{{ l.append(2) }}") ==
        "line 1: access to attribute 'append' of 'list' object is unsafe.");
  CHECK(Error("{{ d.update({}) }}", {{"d", nlohmann::ordered_json::object()}}) ==
        "line 1: access to attribute 'update' of 'dict' object is unsafe.");
}

TEST_CASE("jinja: globals", "[server][jinja]") {
  CHECK(Render("{{ range(5)|list }} {{ range(1, 10, 3)|list }} {{ dict(a=1) }}") ==
        "[0, 1, 2, 3, 4] [1, 4, 7] {'a': 1}");
  CHECK(Render("{% set c = cycler(1, 2) %}{{ c.next() }}{{ c.next() }}{{ c.next() }} "
               "{% set j = joiner('|') %}{{ j() }}a{{ j() }}b") == "121 a|b");
  CHECK(Render("{{ strftime_now('%Y-%m-%d') | length }}") == "10");
  CHECK(Error("{{ raise_exception('Roles must alternate') }}") == "line 1: Roles must alternate");
}

TEST_CASE("jinja: errors name the line", "[server][jinja]") {
  CHECK(Error("line1\nline2\n{{ 1 + }}") == "line 3: unexpected '}}', expected an expression");
  CHECK(Error("a\n{% for x in y %}\nb") ==
        "line 3: unexpected end of template: the 'for' opened on line 2 is not closed (expected "
        "'endfor' or 'else')");
  CHECK(Error("{% if true %}\n{% endfor %}") ==
        "line 2: unknown tag 'endfor' inside the 'if' opened on line 1");
  CHECK(Error("{% include 'x' %}").find("not supported") != std::string::npos);
  CHECK(Error("{{ 'abc }}") == "line 1: unclosed string literal");
  CHECK(Error("{# open") == "line 1: missing end of comment tag");
  CHECK(Error("\n\n{% for x in 3 %}{% endfor %}") == "line 3: 'int' object is not iterable");
  CHECK(Error("{% macro f() %}\n{{ 1 + 'a' }}\n{% endmacro %}\n{{ f() }}") ==
        "line 2: unsupported operand type(s) for +: 'int' and 'str'");
  // Runaway templates end with an error, not a crash or a hung request.
  CHECK(Error("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}")
            .find("nests deeper") != std::string::npos);
  CHECK(Error(std::string(5000, '{') + "%").find("line 1") != std::string::npos);
  std::string nested;
  for (int i = 0; i < 1000; ++i) nested += "{% if true %}";
  CHECK(Error(nested).find("nests deeper") != std::string::npos);
  CHECK(Error("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}")
            .find("steps") != std::string::npos);
  CHECK(Error("{{ 'x' * 1000000000 }}").find("too large") != std::string::npos);
  CHECK(Error("{% set ns = namespace(s='ab') %}{% for i in range(40) %}"
              "{% set ns.s = ns.s ~ ns.s %}{% endfor %}")
            .find("too large") != std::string::npos);
  CHECK(Error("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}").find("recursion") !=
        std::string::npos);
}

}  // namespace thermocline::server::jinja
