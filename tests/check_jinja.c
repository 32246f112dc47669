/* SPDX-License-Identifier: MIT */
/*
 * tests/check_jinja.c - the Jinja2 renderer (engine/model/jinja.h) and chat templates
 * (engine/model/chat.h) construct by construct: expected outputs written from Python's
 * Jinja2 in transformers' environment (the same cases hold in tests/chat_oracle.py's
 * comparison); whitespace control; errors that name the line; filters, tests and statements
 * that do not exist refused at parse time; raise_exception's message exactly; the limits.
 */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/chat.h"
#include "engine/model/jinja.h"
#include "tests/testutil.h"

/* Renders src with vars (JSON text, NULL: {}); returns the rc, output or error in buf. */
static int render(const char *src, const char *vars, char *buf, size_t cap)
{
	struct dps_jinja *t;
	json_t *v = json_loads(vars ? vars : "{}", 0, NULL);
	char err[512], *out;
	size_t len;
	int rc;

	ck_assert_ptr_nonnull(v);
	rc = dps_jinja_parse(&t, src, strlen(src), err, sizeof(err));
	if (rc) {
		snprintf(buf, cap, "%s", err);
		json_decref(v);
		return rc;
	}
	rc = dps_jinja_render(t, v, 1700000000, &out, &len, err, sizeof(err));
	if (rc) {
		snprintf(buf, cap, "%s", err);
	} else {
		ck_assert_uint_eq(strlen(out), len);
		snprintf(buf, cap, "%s", out);
		free(out);
	}
	dps_jinja_free(t);
	json_decref(v);
	return rc;
}

#define EXPECT(src, vars, want)                                                        \
	do {                                                                           \
		char b_[4096];                                                          \
		int rc_ = render(src, vars, b_, sizeof(b_));                            \
		ck_assert_msg(rc_ == 0, "%s: %s", src, b_);                            \
		ck_assert_msg(!strcmp(b_, want), "%s:\n got  [%s]\n want [%s]", src, b_, want); \
	} while (0)

#define EXPECT_ERR(src, vars, want)                                                    \
	do {                                                                           \
		char b_[4096];                                                          \
		int rc_ = render(src, vars, b_, sizeof(b_));                            \
		ck_assert_msg(rc_ == -EINVAL, "%s: rc %d [%s]", src, rc_, b_);          \
		ck_assert_msg(strstr(b_, want), "%s:\n got  [%s]\n want [%s]", src, b_, want); \
	} while (0)

START_TEST(test_text_and_output)
{
	EXPECT("plain text", NULL, "plain text");
	EXPECT("a{{ 1 }}b{{ 'x' }}c", NULL, "a1bxc");
	EXPECT("{# comment #}x", NULL, "x");
	EXPECT("{{ none }} {{ true }} {{ False }} {{ None }}", NULL, "None True False None");
	EXPECT("{{ [1, 'a', none, 2.0] }} {{ {'k': 'v'} }} {{ (1,) }}", NULL,
	       "[1, 'a', None, 2.0] {'k': 'v'} (1,)");
	EXPECT("{{ \"it's\" }} {{ ['it\\'s', 'a\\nb'] }}", NULL, "it's [\"it's\", 'a\\nb']");
	EXPECT("{{ 'a' 'b' }}", NULL, "ab");
	EXPECT("{{ '\\u00e9\\x41\\101\\q' }}", NULL, "\xc3\xa9" "AA\\q");
	EXPECT("trailing newline dropped\n", NULL, "trailing newline dropped");
	EXPECT("crlf\r\nline", NULL, "crlf\nline");
	EXPECT("{% raw %}{{ x }}{% endraw %}", NULL, "{{ x }}");
	EXPECT("{{ x }}|{{ x.y is defined }}", "{\"x\": {\"z\": 1}}", "{'z': 1}|False");
}
END_TEST

START_TEST(test_whitespace)
{
	EXPECT("{% if true %}\nyes\n{% endif %}\nend", NULL, "yes\nend");
	EXPECT("  {% if true %}x{% endif %}", NULL, "x");
	EXPECT("  {%+ if true %}x{% endif %}", NULL, "  x");
	EXPECT("a  {%- if true -%}  b  {%- endif %}", NULL, "ab");
	EXPECT("{% if true +%}\nkeep{% endif %}", NULL, "\nkeep");
	EXPECT("  {{ 'v' }}", NULL, "  v");
	EXPECT("a {{- 'v' -}} b", NULL, "avb");
	EXPECT("  {# c #}\nx", NULL, "x");
	EXPECT("a\n    {% for i in [1, 2] %}\n  {{ i }}\n    {% endfor %}\nb", NULL,
	       "a\n  1\n  2\nb");
}
END_TEST

START_TEST(test_control)
{
	EXPECT("{% if 0 %}a{% elif '' %}b{% elif [1] %}c{% else %}d{% endif %}", NULL, "c");
	EXPECT("{% for x in [] %}a{% else %}empty{% endfor %}", NULL, "empty");
	EXPECT("{% for x in [1, 2, 3, 4] if x is even %}{{ x }}{{ loop.index }}/{{ loop.length }}"
	       "{% endfor %}", NULL, "21/242/2");
	EXPECT("{% for x in 'abc' %}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}"
	       "{{ loop.first }}{{ loop.last }} {% endfor %}", NULL,
	       "032TrueFalse 121FalseFalse 210FalseTrue ");
	EXPECT("{% for x in [1, 2, 3] %}{{ loop.previtem | default('-') }}{{ loop.nextitem | "
	       "default('-') }}{{ loop.cycle('a', 'b') }} {% endfor %}", NULL, "-2a 13b 2-a ");
	EXPECT("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}", NULL,
	       "a=1;b=2;");
	EXPECT("{% for x in [1, 2, 3, 4] %}{% if x == 2 %}{% continue %}{% endif %}"
	       "{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}", NULL, "13");
	EXPECT("{% for a in [1, 2] %}{% for b in [3] %}{{ loop.depth }}{% endfor %}"
	       "{{ loop.depth }}{% endfor %}", NULL, "1111");
	EXPECT("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}", NULL, "1");
	EXPECT("{% set ns = namespace(x=1) %}{% for i in [1, 2] %}{% set ns.x = ns.x + i %}"
	       "{% endfor %}{{ ns.x }}", NULL, "4");
	EXPECT("{% set a, b = 1, 2 %}{{ b }}{{ a }}", NULL, "21");
	EXPECT("{% set s %}  block {{ 1 }} {% endset %}[{{ s }}]", NULL, "[  block 1 ]");
	EXPECT("{% set s | trim | upper %}  block  {% endset %}[{{ s }}]", NULL, "[BLOCK]");
	EXPECT("{% filter upper %}ab{{ 'c' }}{% endfilter %}", NULL, "ABC");
	EXPECT("{% with a = 2 %}{{ a * a }}{% endwith %}{{ a }}", NULL, "4");
	EXPECT("{% generation %}gen{% endgeneration %}", NULL, "gen");
	EXPECT("{% print 1, 2 %}", NULL, "12");
}
END_TEST

START_TEST(test_macros)
{
	EXPECT("{% macro m(a, b='B') %}{{ a }}{{ b }}{% endmacro %}{{ m(1) }}{{ m(1, 2) }}"
	       "{{ m(b=3, a=4) }}{{ m() }}", NULL, "1B1243B");
	EXPECT("{% macro w() %}<{{ caller() }}>{% endmacro %}{% call w() %}in{% endcall %}", NULL,
	       "<in>");
	EXPECT("{% macro f(n) %}{% if n %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(3) }}",
	       NULL, "321");
	EXPECT_ERR("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", NULL,
		   "takes not more than 1 argument");
	EXPECT_ERR("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", NULL, "nested too deeply");
}
END_TEST

START_TEST(test_expressions)
{
	EXPECT("{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 3 ** 2 }} {{ 1 + 1.5 }}",
	       NULL, "3 -4 2 3.5 64 2.5");
	EXPECT("{{ 0.1 + 0.2 }} {{ 1e100 }} {{ 1e-7 }} {{ 100.0 }} {{ -0.0 }} {{ 1/3 }}", NULL,
	       "0.30000000000000004 1e+100 1e-07 100.0 -0.0 0.3333333333333333");
	EXPECT("{{ 'a' ~ 1 ~ none }} {{ 'ab' * 2 }} {{ [1] + [2] }} {{ true + true }}", NULL,
	       "a1None abab [1, 2] 2");
	EXPECT("{{ 1 < 2 < 3 }} {{ 'a' in 'cat' }} {{ 2 not in [1] }} {{ 'k' in {'k': 1} }}", NULL,
	       "True True True True");
	EXPECT("{{ 0 or 'x' }} {{ 1 and [] }} {{ not none }} {{ 'y' if 0 else 'n' }}[{{ 'y' if 0 }}]",
	       NULL, "x [] True n[]");
	EXPECT("{{ x[1:] }} {{ x[::-1] }} {{ x[-1] }} {{ x[5] }}| {{ 'h\xc3\xa9llo'[1:3] }}",
	       "{\"x\": [1, 2, 3]}", "[2, 3] [3, 2, 1] 3 | \xc3\xa9l");
	EXPECT("{{ m.role }}{{ m['role'] }}{{ m.missing }}|{{ m.items() | list }}",
	       "{\"m\": {\"role\": \"user\"}}", "useruser|[('role', 'user')]");
	EXPECT("{{ range(3) | list }} {{ dict(a=1) }} {{ namespace(b=2).b }}", NULL,
	       "[0, 1, 2] {'a': 1} 2");
	EXPECT("{{ strftime_now('%Y-%m-%d %H:%M') }}", NULL, "2023-11-14 22:13");
	EXPECT("{{ ' a  b '.split() }} {{ 'a,b'.split(',') }} {{ 'x--'.rstrip('-') }} "
	       "{{ 'abc'.startswith(('x', 'a')) }} {{ 'hello'.find('l') }} {{ '{}-{}'.format(1, 'b') }}",
	       NULL, "['a', 'b'] ['a', 'b'] x True 2 1-b");
	EXPECT_ERR("{{ 1 + 'a' }}", NULL, "unsupported operand");
	EXPECT_ERR("{{ 'a' + 1 }}", NULL, "can only concatenate str");
	EXPECT_ERR("{{ 1 / 0 }}", NULL, "division by zero");
	EXPECT_ERR("{{ x.y.z }}", "{\"x\": {}}", "'dict object' has no attribute 'y'");
	EXPECT_ERR("{{ nothing.attr }}", NULL, "'nothing' is undefined");
	EXPECT_ERR("{{ [].append(1) }}", NULL,
		   "access to attribute 'append' of 'list' object is unsafe.");
	EXPECT_ERR("{{ none | length }}", NULL, "has no len()");
	EXPECT_ERR("{{ 'x'.casefold() }}", NULL, "not supported");
	EXPECT_ERR("{% for x in none %}{% endfor %}", NULL, "'NoneType' object is not iterable");
	EXPECT_ERR("{{ range(200000) | list }}", NULL, "Range too big");
}
END_TEST

START_TEST(test_filters_and_tests)
{
	EXPECT("{{ ' x ' | trim }} {{ 'ab' | upper }} {{ 'Ab' | lower }} {{ 'a b-c' | title }} "
	       "{{ 'aB' | capitalize }} {{ 'aaa' | replace('a', 'b', 2) }}", NULL,
	       "x AB ab A B-C Ab bba");
	EXPECT("{{ x | length }} {{ x | first }} {{ x | last }} {{ x | join('-') }} {{ x | sum }} "
	       "{{ x | max }} {{ x | reverse | list }} {{ x | sort(reverse=true) }}",
	       "{\"x\": [2, 3, 1]}", "3 2 1 2-3-1 6 3 [1, 3, 2] [3, 2, 1]");
	EXPECT("{{ u | default('d') }} {{ '' | default('d', true) }} {{ '' | d('d') }}", NULL,
	       "d d ");
	EXPECT("{{ m | selectattr('role', 'eq', 'user') | map(attribute='c') | list }} "
	       "{{ m | rejectattr('role', 'equalto', 'user') | list | length }} "
	       "{{ [1, 2, 3] | select('odd') | list }} {{ ['1', '2'] | map('int') | list }}",
	       "{\"m\": [{\"role\": \"user\", \"c\": 1}, {\"role\": \"bot\", \"c\": 2}]}",
	       "[1] 1 [1, 3] [1, 2]");
	EXPECT("{{ ['b', 'A', 'a'] | unique | list }} {{ ['b', 'A', 'a'] | sort }} "
	       "{{ {'b': 1, 'a': 2} | dictsort }} {{ {'a': 1} | items | list }}", NULL,
	       "['b', 'A'] ['A', 'a', 'b'] [('a', 2), ('b', 1)] [('a', 1)]");
	EXPECT("{{ '3' | int + 1 }} {{ '2.5' | float }} {{ 'x' | int }} {{ 2.5 | round }} "
	       "{{ 2.675 | round(2) }} {{ -2 | abs }} {{ 12 | string }} {{ 'a b c' | wordcount }}",
	       NULL, "4 2.5 0 2.0 2.67 2 12 3");
	EXPECT("{{ 'a\nb' | indent(2) }}|{{ 'a\nb' | indent(2, true) }}", NULL, "a\n  b|  a\n  b");
	EXPECT("{{ x | tojson }} {{ x | tojson(indent=2) }} {{ 'é<' | tojson }}",
	       "{\"x\": {\"b\": [1, 2.0], \"a\": null}}",
	       "{\"b\": [1, 2.0], \"a\": null} {\n  \"b\": [\n    1,\n    2.0\n  ],\n  \"a\": null\n} "
	       "\"\xc3\xa9<\"");
	EXPECT("{{ x | tojson(sort_keys=true, separators=(',', ':')) }}",
	       "{\"x\": {\"b\": 1, \"a\": 2}}", "{\"a\":2,\"b\":1}");
	EXPECT("{{ '<a>' | e }} {{ '<a>' | safe }}", NULL, "&lt;a&gt; <a>");
	EXPECT("{{ 1 is number }}{{ 1 is integer }}{{ 1.0 is float }}{{ 's' is string }}"
	       "{{ {} is mapping }}{{ [] is iterable }}{{ 's' is sequence }}{{ none is none }}"
	       "{{ u is undefined }}{{ 4 is even }}{{ 3 is odd }}{{ 6 is divisibleby 3 }}"
	       "{{ true is boolean }}{{ true is true }}{{ 0 is false }}{{ 1 is in [1] }}"
	       "{{ 2 is gt 1 }}{{ 2 is ne 2 }}", NULL,
	       "TrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueFalseTrueTrueFalse");
	EXPECT_ERR("{{ u | tojson }}", NULL, "Object of type Undefined is not JSON serializable");
	EXPECT_ERR("{{ [1] | select('odd') | length }}", NULL, "has no len()");
}
END_TEST

START_TEST(test_parse_errors)
{
	EXPECT_ERR("line one\n{{ x | nosuchfilter }}", NULL, "line 2: unknown filter 'nosuchfilter'");
	EXPECT_ERR("\n\n{% if x is nosuchtest %}{% endif %}", NULL, "line 3: unknown test 'nosuchtest'");
	EXPECT_ERR("{% nosuchtag %}", NULL, "line 1: unknown statement 'nosuchtag'");
	EXPECT_ERR("a\n{% include 'x' %}", NULL, "line 2: unsupported statement 'include'");
	EXPECT_ERR("{{ x | striptags }}", NULL, "unknown filter 'striptags'");
	EXPECT_ERR("{{ x | map('nosuch') }}", NULL, "unknown filter 'nosuch'");
	EXPECT_ERR("{{ x | selectattr('a', 'nosuch') }}", NULL, "unknown test 'nosuch'");
	EXPECT_ERR("{% if x %}never closed", NULL, "unexpected end of template");
	EXPECT_ERR("\n{% endif %}", NULL, "line 2: unexpected 'endif'");
	EXPECT_ERR("{{ x ", NULL, "line 1:");
	EXPECT_ERR("{# open comment", NULL, "missing end of comment");
	EXPECT_ERR("{{ 'unterminated }}", NULL, "unterminated string");
	EXPECT_ERR("{% break %}", NULL, "outside of a for loop");
	{
		char deep[1024] = "{{ ";

		for (int i = 0; i < 300; i++)
			strcat(deep, "(");
		strcat(deep, "1");
		for (int i = 0; i < 300; i++)
			strcat(deep, ")");
		strcat(deep, " }}");
		EXPECT_ERR(deep, NULL, "nested too deeply");
	}
	EXPECT_ERR("x\n\n{{ 1 +* 2 }}", NULL, "line 3:");
}
END_TEST

START_TEST(test_raise_exception)
{
	char b[512];

	ck_assert_int_eq(render("{{ raise_exception('Roles must alternate!') }}", NULL, b,
				sizeof(b)), -EINVAL);
	ck_assert_str_eq(b, "Roles must alternate!");
	ck_assert_int_eq(render("text {% if true %}{{ raise_exception('n=' ~ 3) }}{% endif %}", NULL,
				b, sizeof(b)), -EINVAL);
	ck_assert_str_eq(b, "n=3");
}
END_TEST

START_TEST(test_limits)
{
	struct dps_jinja *t;
	json_t *v = json_object();
	char err[256], *out;
	size_t len;
	const char *src = "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}"
			  "{% endfor %}";

	ck_assert_int_eq(dps_jinja_parse(&t, src, strlen(src), err, sizeof(err)), 0);
	dps_jinja_set_limits(t, 1000, 64 << 20, 100000000);
	ck_assert_int_eq(dps_jinja_render(t, v, 0, &out, &len, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "output exceeds 1000 bytes"), "%s", err);
	dps_jinja_set_limits(t, 1 << 30, 64 << 20, 10000);
	ck_assert_int_eq(dps_jinja_render(t, v, 0, &out, &len, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "runs too long"), "%s", err);
	dps_jinja_free(t);
	src = "{% set ns = namespace(s='xx') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
	      "{% endfor %}";
	ck_assert_int_eq(dps_jinja_parse(&t, src, strlen(src), err, sizeof(err)), 0);
	dps_jinja_set_limits(t, 1 << 30, 16 << 20, 100000000);
	ck_assert_int_eq(dps_jinja_render(t, v, 0, &out, &len, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "memory") || strstr(err, "exceeds"), "%s", err);
	dps_jinja_free(t);
	json_decref(v);
}
END_TEST

START_TEST(test_chat)
{
	static const char cfg[] =
		"{\"bos_token\": {\"content\": \"<s>\", \"lstrip\": false}, \"eos_token\": \"</s>\","
		" \"model_max_length\": 1000000000000000019884624838656,"
		" \"chat_template\": [{\"name\": \"default\", \"template\": \"{{ bos_token }}"
		"{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
		"{% if add_generation_prompt %}[assistant]{% endif %}{{ eos_token }}{{ x }}\"},"
		" {\"name\": \"tool_use\", \"template\": \"tools:{{ tools | length }}\"}]}";
	struct dps_chat *c;
	json_t *msgs = json_loads("[{\"role\": \"user\", \"content\": \"hi\"}]", 0, NULL);
	json_t *tools = json_loads("[{\"name\": \"f\"}]", 0, NULL);
	json_t *extra = json_loads("{\"x\": \"!\"}", 0, NULL);
	char err[256], *out, dir[64], path[128];
	size_t len;
	FILE *f;

	ck_assert_msg(!dps_chat_load_mem(&c, cfg, strlen(cfg), err, sizeof(err)), "%s", err);
	ck_assert_int_eq(dps_chat_render(c, msgs, NULL, 1, extra, 0, &out, &len, err, sizeof(err)),
			 0);
	ck_assert_str_eq(out, "<s>[user]hi[assistant]</s>!");
	free(out);
	ck_assert_int_eq(dps_chat_render(c, msgs, tools, 0, NULL, 0, &out, &len, err, sizeof(err)),
			 0);
	ck_assert_str_eq(out, "tools:1");
	free(out);
	dps_chat_free(c);
	ck_assert_int_eq(dps_chat_load_mem(&c, "{}", 2, err, sizeof(err)), -ENOENT);
	{
		const char *bad = "{\"chat_template\": \"{{ x | bad }}\"}";

		ck_assert_int_eq(dps_chat_load_mem(&c, bad, strlen(bad), err, sizeof(err)), -EINVAL);
	}
	ck_assert_msg(strstr(err, "line 1: unknown filter 'bad'"), "%s", err);
	/* a chat_template.jinja beside the config wins */
	test_tmpdir_make(dir, sizeof(dir), "chat");
	snprintf(path, sizeof(path), "%s/tokenizer_config.json", dir);
	ck_assert_ptr_nonnull(f = fopen(path, "w"));
	fputs("{\"chat_template\": \"config\", \"eos_token\": \"E\"}", f);
	fclose(f);
	ck_assert_int_eq(dps_chat_load(&c, dir, err, sizeof(err)), 0);
	ck_assert_int_eq(dps_chat_render(c, msgs, NULL, 0, NULL, 0, &out, &len, err, sizeof(err)),
			 0);
	ck_assert_str_eq(out, "config");
	free(out);
	dps_chat_free(c);
	snprintf(path, sizeof(path), "%s/chat_template.jinja", dir);
	ck_assert_ptr_nonnull(f = fopen(path, "w"));
	fputs("file {{ eos_token }}\n", f);
	fclose(f);
	ck_assert_int_eq(dps_chat_load(&c, dir, err, sizeof(err)), 0);
	ck_assert_int_eq(dps_chat_render(c, msgs, NULL, 0, NULL, 0, &out, &len, err, sizeof(err)),
			 0);
	ck_assert_str_eq(out, "file E");
	free(out);
	dps_chat_free(c);
	test_tmpdir_remove(dir);
	ck_assert_int_eq(dps_chat_load(&c, "/nonexistent-dir", err, sizeof(err)), -ENOENT);
	json_decref(msgs);
	json_decref(tools);
	json_decref(extra);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("jinja");
	TCase *tc = tcase_create("jinja");

	tcase_add_test(tc, test_text_and_output);
	tcase_add_test(tc, test_whitespace);
	tcase_add_test(tc, test_control);
	tcase_add_test(tc, test_macros);
	tcase_add_test(tc, test_expressions);
	tcase_add_test(tc, test_filters_and_tests);
	tcase_add_test(tc, test_parse_errors);
	tcase_add_test(tc, test_raise_exception);
	tcase_add_test(tc, test_limits);
	tcase_add_test(tc, test_chat);
	tcase_set_timeout(tc, 60);
	suite_add_tcase(s, tc);
	return test_run_suite(s);
}
