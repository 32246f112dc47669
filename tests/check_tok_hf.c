/* SPDX-License-Identifier: MIT */
/*
 * tests/check_tok_hf.c - Check suite for the tokenizer.json backend (engine/model/tok_hf*.c)
 * and common/utf8.c: small tokenizer.json files written here, one feature each (the BPE
 * merges and their ties, byte fallback and unknowns, prefixes and suffixes, ignore_merges,
 * each normalizer, pre-tokenizer and behaviour, the added tokens' rules and ids, the
 * post-processors and tokenizer_config.json, each decoder), with the ids and texts the
 * `tokenizers` library gives; every type this backend lacks refused by name; UTF-8 validation
 * and from_utf8_lossy on the tricky sequences.
 *
 * The expectations were worked out from the library's rules, and are checked against the
 * library itself: with DPS_TOK_HF_EXPORT=FILE every encode and decode case is appended to FILE
 * as a JSON line, which tests/tok_oracle.sh replays with the npm package (tok_oracle.js
 * --cases). In the files below ' stands for " (see load).
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/dps.h"
#include "common/utf8.h"
#include "engine/model/tok.h"
#include "engine/model/tok_hf.h"
#include "tests/testutil.h"

#define HEAD "{'version':'1.0','truncation':null,'padding':null,"
#define TOK(added, norm, pre, post, dec, model)                                           \
	HEAD "'added_tokens':" added ",'normalizer':" norm ",'pre_tokenizer':" pre          \
	     ",'post_processor':" post ",'decoder':" dec ",'model':" model "}"
#define BPE(opts, vocab, merges) "{'type':'BPE','dropout':null" opts ",'vocab':" vocab ",'merges':" merges "}"
#define PLAIN(model) TOK("[]", "null", "null", "null", "null", model)
#define SPLIT(pat, beh) "{'type':'Split','pattern':{'String':'" pat "'},'behavior':'" beh "','invert':false}"
#define ADDED(id, content, flags) "{'id':" #id ",'content':'" content "'," flags "}"
#define SPECIAL "'single_word':false,'lstrip':false,'rstrip':false,'normalized':false,'special':true"
#define NORMAL "'single_word':false,'lstrip':false,'rstrip':false,'normalized':true,'special':false"

static char *swap_quotes(const char *q)
{
	char *s = strdup(q);

	ck_assert_ptr_nonnull(s);
	for (char *p = s; *p; p++)
		if (*p == '\'')
			*p = '"';
	return s;
}

/* Loads q (with ' for ") and, when given, a tokenizer_config.json (likewise). */
static struct dps_tok_hf *load_cfg(const char *q, const char *cfg_q)
{
	char *json = swap_quotes(q), *cfg = cfg_q ? swap_quotes(cfg_q) : NULL, err[512] = "";
	struct dps_tok_hf *t;
	const int rc = dps_tok_hf_load_mem(&t, json, strlen(json), cfg, cfg ? strlen(cfg) : 0, err,
					   sizeof(err));

	ck_assert_msg(rc == 0, "load failed (%d): %s\n%s", rc, err, json);
	free(json);
	free(cfg);
	return t;
}

static struct dps_tok_hf *load(const char *q)
{
	return load_cfg(q, NULL);
}

static void refused(const char *q, const char *want)
{
	char *json = swap_quotes(q), err[512] = "";
	struct dps_tok_hf *t = NULL;
	const int rc = dps_tok_hf_load_mem(&t, json, strlen(json), NULL, 0, err, sizeof(err));

	ck_assert_int_eq(rc, -EINVAL);
	ck_assert_ptr_null(t);
	ck_assert_msg(strstr(err, want), "message \"%s\" lacks \"%s\"", err, want);
	free(json);
}

static void export(json_t *line)
{
	const char *path = getenv("DPS_TOK_HF_EXPORT");
	char *s;
	FILE *f;

	if (path && (s = json_dumps(line, JSON_COMPACT | JSON_ENSURE_ASCII)) &&
	    (f = fopen(path, "a"))) {
		fprintf(f, "%s\n", s);
		fclose(f);
		free(s);
	}
	json_decref(line);
}

static void ids_str(const int *ids, size_t n, char *buf, size_t cap)
{
	size_t k = 0;

	buf[0] = '\0';
	for (size_t i = 0; i < n && k + 12 < cap; i++)
		k += (size_t)snprintf(buf + k, cap - k, i ? " %d" : "%d", ids[i]);
}

/* The ids of text (len bytes) with flags are want ("1 2 3"). */
static void expect_ids_n(const char *q, const char *text, size_t len, unsigned flags,
			 const char *want)
{
	struct dps_tok_hf *t = load(q);
	int *ids;
	size_t n;
	char got[1024];
	char *json = swap_quotes(q);

	ck_assert_int_eq(dps_tok_hf_encode(t, text, len, flags, 0, &ids, &n), 0);
	ids_str(ids, n, got, sizeof(got));
	ck_assert_msg(!strcmp(got, want), "\"%s\": got [%s], want [%s]\n%s", text, got, want, json);
	export(json_pack("{s:s,s:s%,s:b,s:s}", "json", json, "text", text, len, "special",
			 (flags & DPS_TOK_ADD_SPECIAL) != 0, "ids", want));
	free(json);
	free(ids);
	dps_tok_hf_free(t);
}

static void expect_ids(const char *q, const char *text, unsigned flags, const char *want)
{
	expect_ids_n(q, text, strlen(text), flags, want);
}

/* Decoding ids (an array) with flags gives want. */
static void expect_text(const char *q, const int *ids, size_t n, unsigned flags,
			const char *want)
{
	struct dps_tok_hf *t = load(q);
	char *text, *json = swap_quotes(q), buf[256];
	size_t len;

	ck_assert_int_eq(dps_tok_hf_decode(t, ids, n, flags, &text, &len), 0);
	ck_assert_uint_eq(len, strlen(text));
	ck_assert_msg(!strcmp(text, want), "got \"%s\", want \"%s\"", text, want);
	ids_str(ids, n, buf, sizeof(buf));
	export(json_pack("{s:s,s:s,s:b,s:s}", "json", json, "decode", buf, "skip",
			 (flags & DPS_TOK_SKIP_SPECIAL) != 0, "text", want));
	free(json);
	free(text);
	dps_tok_hf_free(t);
}

/* ---- the BPE model ---- */

#define V_ABC "{'a':0,'b':1,'c':2,'ab':3,'bc':4,'abc':5,'aa':6}"

START_TEST(test_bpe_merges)
{
	/* By rank: ab first, then ab+c; strings or pairs. */
	expect_ids(PLAIN(BPE("", V_ABC, "['a b','ab c']")), "abc", 0, "5");
	expect_ids(PLAIN(BPE("", V_ABC, "[['a','b'],['ab','c']]")), "abc", 0, "5");
	/* b c ranks first: a + bc, which does not merge. */
	expect_ids(PLAIN(BPE("", V_ABC, "[['b','c'],['a','b']]")), "abc", 0, "0 4");
	/* Equal ranks merge leftmost first; a merged-away symbol's entry is dropped. */
	expect_ids(PLAIN(BPE("", V_ABC, "['a a']")), "aaa", 0, "6 0");
	expect_ids(PLAIN(BPE("", V_ABC, "['a a']")), "aaaa", 0, "6 6");
	/* A pair listed twice keeps its later rank: b c now goes first. */
	expect_ids(PLAIN(BPE("", V_ABC, "['a b','b c','a b']")), "abc", 0, "0 4");
	/* A character outside the vocabulary (no unk_token) is dropped, and its neighbours
	 * become neighbours. */
	expect_ids(PLAIN(BPE("", V_ABC, "['a b']")), "a b", 0, "3");
	expect_ids(PLAIN(BPE("", V_ABC, "['a b']")), "", 0, "");
	/* The text format's version line takes no rank. */
	expect_ids(PLAIN(BPE("", V_ABC, "['#version: 0.2','b c','a b']")), "abc", 0, "0 4");
}
END_TEST

#define V_UNK "{'<unk>':0,'a':1,'<0xC3>':2,'<0xA9>':3}"

START_TEST(test_bpe_unknown)
{
	/* Byte fallback where every byte has a token, else the unknown token. */
	expect_ids(PLAIN(BPE(",'unk_token':'<unk>','byte_fallback':true", V_UNK, "[]")),
		   "a\xc3\xa9xa", 0, "1 2 3 0 1");
	/* Fused unknowns. */
	expect_ids(PLAIN(BPE(",'unk_token':'<unk>','fuse_unk':true", V_UNK, "[]")),
		   "xy\xc3\xa9", 0, "0");
	expect_ids(PLAIN(BPE(",'unk_token':'<unk>','fuse_unk':true", V_UNK, "[]")), "xay", 0,
		   "0 1 0");
	expect_ids(PLAIN(BPE(",'unk_token':'<unk>','fuse_unk':false", V_UNK, "[]")), "xy", 0,
		   "0 0");
	expect_ids(PLAIN(BPE("", V_UNK, "[]")), "xay", 0, "1");
	/* As the library: an unknown still pending is added after a byte fallback. */
	expect_ids(PLAIN(BPE(",'unk_token':'<unk>','fuse_unk':true,'byte_fallback':true", V_UNK,
			     "[]")),
		   "x\xc3\xa9", 0, "2 3 0");
}
END_TEST

START_TEST(test_bpe_options)
{
	const char *v = "{'a':0,'b':1,'ab':2,'abb':3,'bb':4}";
	char q[512];

	/* ignore_merges: a word that is a token is that token. */
	snprintf(q, sizeof(q), TOK("[]", "null", "{'type':'WhitespaceSplit'}", "null", "null",
				   BPE(",'ignore_merges':%s", "%s", "['a b','b b']")),
		 "false", v);
	expect_ids(q, "abb abb", 0, "2 1 2 1");
	snprintf(q, sizeof(q), TOK("[]", "null", "{'type':'WhitespaceSplit'}", "null", "null",
				   BPE(",'ignore_merges':%s", "%s", "['a b','b b']")),
		 "true", v);
	expect_ids(q, "abb abb", 0, "3 3");
	/* continuing_subword_prefix and end_of_word_suffix. */
	expect_ids(PLAIN(BPE(",'continuing_subword_prefix':'##','end_of_word_suffix':'</w>'",
			     "{'a':0,'##b':1,'##c</w>':2,'ab':3,'abc</w>':4}",
			     "['a ##b','ab ##c</w>']")),
		   "abc", 0, "4");
	expect_ids(PLAIN(BPE(",'continuing_subword_prefix':'##','end_of_word_suffix':'</w>'",
			     "{'a':0,'##b':1,'##c</w>':2,'ab':3,'abc</w>':4}",
			     "['a ##b','ab ##c</w>']")),
		   "ab", 0, "0");
}
END_TEST

START_TEST(test_refusals)
{
	refused(HEAD "'model':{'type':'BPE','dropout':0.1,'vocab':{},'merges':[]}}",
		"model.dropout must be null");
	refused(HEAD "'model':{'type':'Unigram','vocab':[]}}", "model type \"Unigram\"");
	refused(HEAD "'model':{'type':'WordPiece','vocab':{}}}", "model type \"WordPiece\"");
	refused(TOK("[]", "{'type':'BertNormalizer'}", "null", "null", "null", BPE("", "{}", "[]")),
		"normalizer type \"BertNormalizer\" is not supported");
	refused(TOK("[]", "{'type':'Precompiled','precompiled_charsmap':''}", "null", "null", "null",
		    BPE("", "{}", "[]")),
		"normalizer type \"Precompiled\" is not supported");
	refused(TOK("[]", "null", "{'type':'BertPreTokenizer'}", "null", "null", BPE("", "{}", "[]")),
		"pre_tokenizer type \"BertPreTokenizer\" is not supported");
	refused(TOK("[]", "null", "{'type':'Sequence','pretokenizers':[{'type':'Punctuation'}]}",
		    "null", "null", BPE("", "{}", "[]")),
		"pre_tokenizer type \"Punctuation\" is not supported");
	refused(TOK("[]", "null", "null", "null", "{'type':'CTC'}", BPE("", "{}", "[]")),
		"decoder type \"CTC\" is not supported");
	refused(TOK("[]", "null", "null", "null", "{'type':'WordPiece','prefix':'##'}",
		    BPE("", "{}", "[]")),
		"decoder type \"WordPiece\" is not supported");
	refused("{'truncation':{'max_length':8},'model':" BPE("", "{}", "[]") "}",
		"truncation is set");
	refused("{'padding':{'strategy':'BatchLongest'},'model':" BPE("", "{}", "[]") "}",
		"padding is set");
	refused(PLAIN(BPE("", "{'a':0}", "['a b']")), "model.merges[0]: token \"b\" is not in");
	refused(PLAIN(BPE("", "{'a':0,'b':1}", "['a b']")), "the merged token \"ab\" is not in");
	refused(PLAIN(BPE("", "{'a':0,'b':1}", "['a  b']")), "model.merges[0] is not two tokens");
	refused(PLAIN(BPE(",'unk_token':'<unk>'", "{'a':0}", "[]")),
		"model.unk_token \"<unk>\" is not in model.vocab");
	refused(PLAIN(BPE("", "{'a':0,'b':0}", "[]")), "gives id 0 to both");
	refused(PLAIN(BPE("", "{'a':-1}", "[]")), "model.vocab[\"a\"] is not an integer id");
	refused(TOK("[]", "null", "null",
		    "{'type':'TemplateProcessing','single':[{'SpecialToken':{'id':'<s>','type_id':0}}],"
		    "'pair':[],'special_tokens':{}}",
		    "null", BPE("", "{}", "[]")),
		"special token \"<s>\" has no list");
	refused(TOK("[]", "null", "{'type':'Split','pattern':{'Regex':'[[:alpha:]]'},"
		    "'behavior':'Isolated','invert':false}", "null", "null", BPE("", "{}", "[]")),
		"a POSIX bracket class is not supported");
	refused(TOK("[]", "null", "{'type':'Split','pattern':{'Regex':'(unclosed'},"
		    "'behavior':'Isolated','invert':false}", "null", "null", BPE("", "{}", "[]")),
		"does not compile");
	refused(TOK("[]", "null", SPLIT(" ", "Sideways"), "null", "null", BPE("", "{}", "[]")),
		"Split.behavior \"Sideways\"");
	/* Every other type of the library, by name. */
	{
		static const char *const others[][2] = {
			{ "normalizer", "Nmt" },           { "normalizer", "ByteLevel" },
			{ "pre_tokenizer", "CharDelimiterSplit" },
			{ "pre_tokenizer", "UnicodeScripts" },
			{ "pre_tokenizer", "FixedLength" },
			{ "decoder", "BPEDecoder" },   { "model", "WordLevel" },
		};
		for (size_t i = 0; i < sizeof(others) / sizeof(others[0]); i++) {
			char q[256], want[96];

			if (!strcmp(others[i][0], "model"))
				snprintf(q, sizeof(q), "{'model':{'type':'%s','vocab':{}}}", others[i][1]);
			else
				snprintf(q, sizeof(q), "{'%s':{'type':'%s'},'model':" BPE("", "{}", "[]")
					 "}", others[i][0], others[i][1]);
			snprintf(want, sizeof(want), "%s type \"%s\"", others[i][0], others[i][1]);
			refused(q, want);
		}
	}
	refused("{'version':'2.0','model':" BPE("", "{}", "[]") "}", "version is not \"1.0\"");
	refused("[1, 2", "line 1");
	refused("{'model':" BPE("", "{}", "[]") ",'added_tokens':[{'id':0,'content':'x'}]}",
		"added_tokens[0].single_word is missing");
}
END_TEST

/* ---- normalizers ---- */

#define V_CHARS \
	"{'a':0,'b':1,' ':2,'e':3,'\xc3\xa9':4,'\xcc\x81':5,'f':6,'i':7,'\xcc\x87':8,'\xe2\x96\x81':9," \
	"'c':10}"
#define NORM(n) TOK("[]", n, "null", "null", "null", BPE("", V_CHARS, "[]"))

START_TEST(test_normalizers)
{
	expect_ids(NORM("{'type':'NFC'}"), "e\xcc\x81", 0, "4");
	expect_ids(NORM("{'type':'NFD'}"), "\xc3\xa9", 0, "3 5");
	expect_ids(NORM("{'type':'NFKC'}"), "\xef\xac\x81", 0, "6 7");
	expect_ids(NORM("{'type':'NFKD'}"), "\xef\xac\x81\xc3\xa9", 0, "6 7 3 5");
	expect_ids(NORM("{'type':'Sequence','normalizers':[{'type':'NFD'},{'type':'StripAccents'}]}"),
		   "\xc3\xa9", 0, "3");
	/* char::to_lowercase: İ becomes i and a combining dot. */
	expect_ids(NORM("{'type':'Lowercase'}"), "A\xc4\xb0" "B", 0, "0 7 8 1");
	expect_ids(NORM("{'type':'Strip','strip_left':true,'strip_right':true}"), "  a b \t", 0,
		   "0 2 1");
	expect_ids(NORM("{'type':'Strip','strip_left':false,'strip_right':true}"), "  a ", 0,
		   "2 2 0");
	expect_ids(NORM("{'type':'Prepend','prepend':'\xe2\x96\x81'}"), "ab", 0, "9 0 1");
	expect_ids(NORM("{'type':'Prepend','prepend':'\xe2\x96\x81'}"), "", 0, "");
	expect_ids(NORM("{'type':'Replace','pattern':{'String':' '},'content':'\xe2\x96\x81'}"),
		   "a b", 0, "0 9 1");
	expect_ids(NORM("{'type':'Replace','pattern':{'Regex':'b+'},'content':'c'}"), "abbbab", 0,
		   "0 10 0 10");
	/* Llama 2's: spaces become U+2581, one more in front. */
	expect_ids(NORM("{'type':'Sequence','normalizers':[{'type':'Prepend','prepend':'\xe2\x96\x81'},"
			"{'type':'Replace','pattern':{'String':' '},'content':'\xe2\x96\x81'}]}"),
		   " a", 0, "9 9 0");
}
END_TEST

/* ---- pre-tokenizers ---- */

#define V_SP "{'a':0,'b':1,' ':2,'a ':3,' b':4,'a b':5}"
#define M_SP "[['a',' '],[' ','b'],['a ','b']]"
#define PRE(p) TOK("[]", "null", p, "null", "null", BPE("", V_SP, M_SP))

START_TEST(test_split_behaviours)
{
	expect_ids(PRE("null"), "a b", 0, "5");
	expect_ids(PRE(SPLIT(" ", "Isolated")), "a b", 0, "0 2 1");
	expect_ids(PRE(SPLIT(" ", "Removed")), "a b", 0, "0 1");
	expect_ids(PRE(SPLIT(" ", "MergedWithPrevious")), "a b", 0, "3 1");
	expect_ids(PRE(SPLIT(" ", "MergedWithNext")), "a b", 0, "0 4");
	expect_ids(PRE(SPLIT(" ", "Contiguous")), "a  b", 0, "0 2 2 1");
	expect_ids(PRE(SPLIT(" ", "MergedWithPrevious")), "a  b", 0, "3 2 1");
	expect_ids(PRE(SPLIT(" ", "MergedWithNext")), "a  b", 0, "0 2 4");
	expect_ids(PRE("{'type':'Split','pattern':{'String':' '},'behavior':'Removed','invert':true}"),
		   "a b", 0, "2");
	expect_ids(PRE("{'type':'Split','pattern':{'Regex':'\\\\s+'},'behavior':'Isolated',"
		       "'invert':false}"),
		   "a  b", 0, "0 2 2 1");
	expect_ids(PRE("{'type':'WhitespaceSplit'}"), "a \t b", 0, "0 1");
	expect_ids(PRE("{'type':'Sequence','pretokenizers':[" SPLIT(" ", "MergedWithNext") ","
		       SPLIT("b", "Isolated") "]}"),
		   "a b", 0, "0 2 1");
}
END_TEST

START_TEST(test_pretokenizers)
{
	const char *digits = "{'a':0,'b':1,'1':2,'2':3,'3':4,'12':5,'123':6}";
	char q[1024];

	snprintf(q, sizeof(q), TOK("[]", "null", "{'type':'Digits','individual_digits':%s}", "null",
				   "null", BPE("", "%s", "['1 2','12 3']")), "true", digits);
	expect_ids(q, "a123b", 0, "0 2 3 4 1");
	snprintf(q, sizeof(q), TOK("[]", "null", "{'type':'Digits','individual_digits':%s}", "null",
				   "null", BPE("", "%s", "['1 2','12 3']")), "false", digits);
	expect_ids(q, "a123b", 0, "0 6 1");
	/* The regex crate's \w+|[^\w\s]+ against splitting at whitespace only. */
	expect_ids(TOK("[]", "null", "{'type':'Whitespace'}", "null", "null",
		       BPE("", "{'a':0,',':1,'b':2,'a,':3}", "['a ,']")), "a, b", 0, "0 1 2");
	expect_ids(TOK("[]", "null", "{'type':'WhitespaceSplit'}", "null", "null",
		       BPE("", "{'a':0,',':1,'b':2,'a,':3}", "['a ,']")), "a, b", 0, "3 2");
}
END_TEST

/* Byte-level: space is \xc4\xa0 (U+0120), 0xC3 is U+00C3, 0xA9 is U+00A9. */
#define V_BL "{'a':0,'b':1,'\xc4\xa0':2,'\xc4\xa0" "b':3,'\xc4\xa0" "a':4,'a\xc4\xa0':5," \
	     "'\xc3\x83':6,'\xc2\xa9':7}"
#define M_BL "[['a','\xc4\xa0'],['\xc4\xa0','b'],['\xc4\xa0','a']]"
#define BL(aps, rx) TOK("[]", "null", "{'type':'ByteLevel','add_prefix_space':" aps        \
			",'trim_offsets':true,'use_regex':" rx "}", "null",                   \
			"{'type':'ByteLevel','add_prefix_space':true,'trim_offsets':true,"    \
			"'use_regex':true}", BPE("", V_BL, M_BL))

START_TEST(test_bytelevel)
{
	expect_ids(BL("false", "true"), "a b", 0, "0 3");
	expect_ids(BL("true", "true"), "a b", 0, "4 3");
	expect_ids(BL("false", "false"), "a b", 0, "5 1");
	expect_ids(BL("false", "true"), "\xc3\xa9", 0, "6 7");
	{
		const int ids[] = { 4, 3 }, bad[] = { 6 }, both[] = { 6, 7, 2 };

		expect_text(BL("false", "true"), ids, 2, 0, " a b");
		/* A lone lead byte: from_utf8_lossy. */
		expect_text(BL("false", "true"), bad, 1, 0, "\xef\xbf\xbd");
		expect_text(BL("false", "true"), both, 3, 0, "\xc3\xa9 ");
	}
}
END_TEST

#define V_MS "{'\xe2\x96\x81':0,'a':1,'b':2,'\xe2\x96\x81" "a':3,'\xe2\x96\x81" "b':4,'<s>':5}"
#define M_MS "[['\xe2\x96\x81','a'],['\xe2\x96\x81','b']]"
#define MS(scheme, split) TOK("[" ADDED(5, "<s>", SPECIAL) "]", "null",                     \
			      "{'type':'Metaspace','replacement':'\xe2\x96\x81','prepend_scheme':'" \
			      scheme "','split':" split "}", "null",                            \
			      "{'type':'Metaspace','replacement':'\xe2\x96\x81','prepend_scheme':'" \
			      scheme "','split':" split "}", BPE("", V_MS, M_MS))

/* A long word (no pre-tokenizer, as Llama 2) merged piece by piece between the places no merge
 * crosses: the same ids as merged whole; and with a token that crosses such a place ("a▁"), the
 * pieces are not used (the ids show the merge across). */
START_TEST(test_long_word_pieces)
{
#define MS_CH "\xe2\x96\x81"
	char text[1024], want[1024];
	size_t k = 0, w = 0;

	k += (size_t)snprintf(text + k, sizeof(text) - k, "a");
	for (int i = 0; i < 100; i++)
		k += (size_t)snprintf(text + k, sizeof(text) - k, MS_CH "a");
	w += (size_t)snprintf(want + w, sizeof(want) - w, "1");
	for (int i = 0; i < 100; i++)
		w += (size_t)snprintf(want + w, sizeof(want) - w, " 2");
	expect_ids(PLAIN(BPE("", "{'" MS_CH "':0,'a':1,'" MS_CH "a':2}", "['" MS_CH " a']")), text,
		   0, want);
	w = 0;
	for (int i = 0; i < 100; i++)
		w += (size_t)snprintf(want + w, sizeof(want) - w, i ? " 3" : "3");
	w += (size_t)snprintf(want + w, sizeof(want) - w, " 1");
	expect_ids(PLAIN(BPE("", "{'" MS_CH "':0,'a':1,'" MS_CH "a':2,'a" MS_CH "':3}",
			     "['a " MS_CH "','" MS_CH " a']")), text, 0, want);
#undef MS_CH
}
END_TEST

START_TEST(test_metaspace)
{
	expect_ids(MS("always", "true"), "a b", 0, "3 4");
	expect_ids(MS("never", "true"), "a b", 0, "1 4");
	expect_ids(MS("first", "false"), "a b", 0, "3 4");
	/* first: only the piece at the start of the text gets one. */
	expect_ids(MS("first", "false"), "<s>a", 0, "5 1");
	expect_ids(MS("always", "false"), "<s>a", 0, "5 3");
	expect_ids(MS("first", "true"), "a<s>a", 0, "3 5 1");
	{
		const int ids[] = { 3, 4 };

		expect_text(MS("always", "true"), ids, 2, 0, "a b");
		expect_text(MS("never", "true"), ids, 2, 0, " a b");
	}
}
END_TEST

/* ---- added tokens ---- */

#define V_ADD "{'a':0,'b':1,' ':2,'c':3,'<s>':4}"

START_TEST(test_added_ids)
{
	/* The file's ids are not read: <s> is the vocabulary's 4, <x> the first new id (5, the
	 * number of vocabulary entries), <y> the next. */
	const char *q = TOK("[" ADDED(99, "<s>", SPECIAL) "," ADDED(100, "<x>", SPECIAL) ","
			    ADDED(7, "<y>", SPECIAL) "]", "null", "null", "null", "null",
			    BPE("", V_ADD, "[]"));
	struct dps_tok_hf *t = load(q);

	expect_ids(q, "a<s>b<x><y>", 0, "0 4 1 5 6");
	ck_assert_int_eq(dps_tok_hf_vocab_size(t), 7);
	ck_assert_int_eq(dps_tok_hf_token_id(t, "<x>", 3), 5);
	ck_assert_int_eq(dps_tok_hf_token_id(t, "c", 1), 3);
	ck_assert_int_eq(dps_tok_hf_token_id(t, "zz", 2), -1);
	ck_assert(dps_tok_hf_is_special(t, 4));
	ck_assert(!dps_tok_hf_is_special(t, 3));
	ck_assert(!dps_tok_hf_is_special(t, 70));
	ck_assert_uint_eq(dps_tok_hf_max_piece(t), 3);
	dps_tok_hf_free(t);
}
END_TEST

START_TEST(test_added_matching)
{
	/* Leftmost-longest. */
	expect_ids(TOK("[" ADDED(5, "<a>", SPECIAL) "," ADDED(6, "<a><b>", SPECIAL) "]", "null",
		       "null", "null", "null", BPE("", V_ADD, "[]")),
		   "<a><b><a>", 0, "6 5");
	/* lstrip and rstrip take the spaces in. */
	expect_ids(TOK("[{'id':5,'content':'<m>','single_word':false,'lstrip':true,'rstrip':true,"
		       "'normalized':false,'special':true}]", "null", "null", "null", "null",
		       BPE("", V_ADD, "[]")),
		   "a  <m>  b", 0, "0 5 1");
	expect_ids(TOK("[{'id':5,'content':'<m>','single_word':false,'lstrip':false,'rstrip':true,"
		       "'normalized':false,'special':true}]", "null", "null", "null", "null",
		       BPE("", V_ADD, "[]")),
		   "a  <m>  b", 0, "0 2 2 5 1");
	/* single_word: not inside a word. */
	expect_ids(TOK("[{'id':5,'content':'ab','single_word':true,'lstrip':false,'rstrip':false,"
		       "'normalized':false,'special':false}]", "null", "null", "null", "null",
		       BPE("", V_ADD, "[]")),
		   "ab cab ab", 0, "5 2 3 0 1 2 5");
	/* normalized tokens match the normalized text, the others the raw text; "b" keeps its
	 * vocabulary id, "C" takes the first new one. */
	expect_ids(TOK("[" ADDED(5, "b", NORMAL) "," ADDED(6, "C", SPECIAL) "]",
		       "{'type':'Lowercase'}", "null", "null", "null", BPE("", V_ADD, "[]")),
		   "aBCc", 0, "0 1 5 3");
}
END_TEST

/* ---- post-processors and tokenizer_config.json ---- */

#define V_POST "{'<s>':0,'</s>':1,'a':2,'b':3}"
#define ADDED_POST "[" ADDED(0, "<s>", SPECIAL) "," ADDED(1, "</s>", SPECIAL) "]"
#define TPL(single) TOK(ADDED_POST, "null", "null",                                         \
			"{'type':'TemplateProcessing','single':[" single "],'pair':[],"             \
			"'special_tokens':{'<s>':{'id':'<s>','ids':[0],'tokens':['<s>']},"          \
			"'</s>':{'id':'</s>','ids':[1],'tokens':['</s>']}}}",                       \
			"null", BPE("", V_POST, "[]"))
#define TS(id) "{'SpecialToken':{'id':'" id "','type_id':0}}"
#define TA "{'Sequence':{'id':'A','type_id':0}}"

START_TEST(test_post)
{
	expect_ids(TPL(TS("<s>") "," TA "," TS("</s>")), "ab", DPS_TOK_ADD_SPECIAL, "0 2 3 1");
	expect_ids(TPL(TS("<s>") "," TA "," TS("</s>")), "ab", 0, "2 3");
	expect_ids(TPL(TS("<s>") "," TA "," TS("</s>")), "", DPS_TOK_ADD_SPECIAL, "0 1");
	/* The sequence as often as the template names it, with or without special tokens. */
	expect_ids(TPL(TA "," TA), "a", 0, "2 2");
	expect_ids(TOK(ADDED_POST, "null", "null",
		       "{'type':'RobertaProcessing','sep':['</s>',1],'cls':['<s>',0],"
		       "'trim_offsets':true,'add_prefix_space':false}", "null",
		       BPE("", V_POST, "[]")),
		   "ab", DPS_TOK_ADD_SPECIAL, "0 2 3 1");
	expect_ids(TOK(ADDED_POST, "null", "null",
		       "{'type':'BertProcessing','sep':['</s>',1],'cls':['<s>',0]}", "null",
		       BPE("", V_POST, "[]")),
		   "a", DPS_TOK_ADD_SPECIAL, "0 2 1");
	expect_ids(TOK(ADDED_POST, "null", "null",
		       "{'type':'Sequence','processors':[{'type':'ByteLevel','add_prefix_space':false,"
		       "'trim_offsets':false,'use_regex':false},{'type':'BertProcessing',"
		       "'sep':['</s>',1],'cls':['<s>',0]}]}", "null", BPE("", V_POST, "[]")),
		   "a", DPS_TOK_ADD_SPECIAL, "0 2 1");
	refused(TOK(ADDED_POST, "null", "null",
		    "{'type':'Sequence','processors':[{'type':'BertProcessing','sep':['</s>',1],"
		    "'cls':['<s>',0]},{'type':'BertProcessing','sep':['</s>',1],'cls':['<s>',0]}]}",
		    "null", BPE("", V_POST, "[]")),
		"more than one processor that adds tokens");
}
END_TEST

START_TEST(test_config)
{
	const char *q = TPL(TS("<s>") "," TA);
	struct dps_tok_hf *t;
	int *ids;
	size_t n;
	char got[64];

	/* transformers' LlamaTokenizerFast: bos? $A eos? from the config. */
	t = load_cfg(q, "{'tokenizer_class':'LlamaTokenizerFast','add_bos_token':false,"
		     "'add_eos_token':true,'bos_token':'<s>','eos_token':{'content':'</s>'}}");
	ck_assert_int_eq(dps_tok_hf_encode(t, "ab", 2, DPS_TOK_ADD_SPECIAL, 0, &ids, &n), 0);
	ids_str(ids, n, got, sizeof(got));
	ck_assert_str_eq(got, "2 3 1");
	free(ids);
	dps_tok_hf_free(t);
	/* Defaults: add_bos_token true, add_eos_token false, "<s>" and "</s>". */
	t = load_cfg(q, "{'tokenizer_class':'LlamaTokenizer','model_max_length':1000000000000000019884624838656}");
	ck_assert_int_eq(dps_tok_hf_encode(t, "ab", 2, DPS_TOK_ADD_SPECIAL, 0, &ids, &n), 0);
	ids_str(ids, n, got, sizeof(got));
	ck_assert_str_eq(got, "0 2 3");
	free(ids);
	dps_tok_hf_free(t);
	/* Any other class keeps tokenizer.json's post-processor. */
	t = load_cfg(q, "{'tokenizer_class':'PreTrainedTokenizerFast','add_eos_token':true}");
	ck_assert_int_eq(dps_tok_hf_encode(t, "ab", 2, DPS_TOK_ADD_SPECIAL, 0, &ids, &n), 0);
	ids_str(ids, n, got, sizeof(got));
	ck_assert_str_eq(got, "0 2 3");
	free(ids);
	dps_tok_hf_free(t);
	{
		char *json = swap_quotes(q), err[256];
		const char *cfg = "{\"tokenizer_class\":\"GemmaTokenizerFast\"}";

		/* Gemma's default "<bos>" is not a token here. */
		ck_assert_int_eq(dps_tok_hf_load_mem(&t, json, strlen(json), cfg, strlen(cfg), err,
						     sizeof(err)), -EINVAL);
		ck_assert_ptr_nonnull(strstr(err, "bos_token \"<bos>\" is not a token"));
		free(json);
	}
}
END_TEST

START_TEST(test_limit)
{
	struct dps_tok_hf *t = load(TPL(TS("<s>") "," TA "," TS("</s>")));
	int *ids = (int *)1;
	size_t n = 9;

	ck_assert_int_eq(dps_tok_hf_encode(t, "abab", 4, 0, 3, &ids, &n), -E2BIG);
	ck_assert_ptr_null(ids);
	ck_assert_int_eq(dps_tok_hf_encode(t, "abab", 4, 0, 4, &ids, &n), 0);
	ck_assert_uint_eq(n, 4);
	free(ids);
	ck_assert_int_eq(dps_tok_hf_encode(t, "abab", 4, DPS_TOK_ADD_SPECIAL, 5, &ids, &n), -E2BIG);
	ck_assert_int_eq(dps_tok_hf_encode(t, "abab", 4, DPS_TOK_ADD_SPECIAL, 6, &ids, &n), 0);
	ck_assert_uint_eq(n, 6);
	free(ids);
	ck_assert_int_eq(dps_tok_hf_encode(t, "", 0, DPS_TOK_ADD_SPECIAL, 1, &ids, &n), -E2BIG);
	dps_tok_hf_free(t);
}
END_TEST

/* ---- decoders ---- */

#define V_DEC "{'<s>':0,'\xe2\x96\x81Hello':1,'\xe2\x96\x81world':2,'<0x41>':3,'<0x42>':4," \
	      "'<0xE6>':5,'<0x97>':6,'<0x+5>':7,'x':8}"
#define DEC(d) TOK("[" ADDED(0, "<s>", SPECIAL) "]", "null", "null", "null", d,            \
		   BPE("", V_DEC, "[]"))
#define LLAMA2_DEC                                                                          \
	"{'type':'Sequence','decoders':[{'type':'Replace','pattern':{'String':'\xe2\x96\x81'},"   \
	"'content':' '},{'type':'ByteFallback'},{'type':'Fuse'},{'type':'Strip','content':' '," \
	"'start':1,'stop':0}]}"

START_TEST(test_decoders)
{
	const int hello[] = { 0, 1, 2 }, bytes[] = { 3, 4, 8 }, cut[] = { 5, 6, 3 },
		  plus[] = { 7 }, unknown[] = { 1, 999, 2 };

	expect_text(DEC(LLAMA2_DEC), hello, 3, 0, "<s> Hello world");
	expect_text(DEC(LLAMA2_DEC), hello, 3, DPS_TOK_SKIP_SPECIAL, "Hello world");
	expect_text(DEC(LLAMA2_DEC), bytes, 3, 0, "ABx");
	/* A run of byte tokens that is not UTF-8: one U+FFFD per byte, the valid 'A' too. */
	expect_text(DEC(LLAMA2_DEC), cut, 3, 0, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
	/* u8::from_str_radix reads "+5" as 5. */
	expect_text(DEC(LLAMA2_DEC), plus, 1, 0, "\x05");
	expect_text(DEC(LLAMA2_DEC), unknown, 3, 0, "Hello world");
	{
		struct dps_tok_hf *t = load(DEC(LLAMA2_DEC));
		const int neg[] = { -5, 1 };
		char *text;
		size_t len;

		ck_assert_int_eq(dps_tok_hf_decode(t, neg, 2, 0, &text, &len), 0);
		ck_assert_str_eq(text, "Hello");
		free(text);
		dps_tok_hf_free(t);
	}
	/* Without a decoder the strings are joined with spaces. */
	expect_text(DEC("null"), hello, 3, 0, "<s> \xe2\x96\x81Hello \xe2\x96\x81world");
	expect_text(DEC("{'type':'Fuse'}"), bytes, 3, 0, "<0x41><0x42>x");
	expect_text(DEC("{'type':'Strip','content':'<','start':2,'stop':1}"), bytes, 3, 0,
		    "0x41>0x42>x");
	expect_text(DEC("{'type':'Replace','pattern':{'Regex':'<0x(4.)>'},'content':'#'}"), bytes,
		    3, 0, "##x");
	expect_text(DEC("{'type':'Metaspace','replacement':'\xe2\x96\x81','prepend_scheme':'always',"
			"'split':true}"), hello, 3, 0, "<s> Hello world");
}
END_TEST

/* ---- common/utf8.c ---- */

static void lossy(const char *in, size_t n, const char *want)
{
	size_t len;
	char *out = dps_utf8_lossy(in, n, &len);

	ck_assert_ptr_nonnull(out);
	ck_assert_uint_eq(len, strlen(want));
	ck_assert_msg(!memcmp(out, want, len), "lossy of %zu bytes", n);
	ck_assert(dps_utf8_valid(out, len));
	free(out);
}

#define R "\xef\xbf\xbd"

START_TEST(test_utf8)
{
	ck_assert(dps_utf8_valid("", 0));
	ck_assert(dps_utf8_valid("a\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80", 10));
	ck_assert(dps_utf8_valid("\xf4\x8f\xbf\xbf", 4));       /* U+10FFFF */
	ck_assert(dps_utf8_valid("\xed\x9f\xbf", 3));           /* U+D7FF */
	ck_assert(dps_utf8_valid("a\0b", 3));
	ck_assert(!dps_utf8_valid("\xc3", 1));                  /* truncated */
	ck_assert(!dps_utf8_valid("\xc0\x80", 2));              /* overlong NUL */
	ck_assert(!dps_utf8_valid("\xe0\x80\xaf", 3));          /* overlong */
	ck_assert(!dps_utf8_valid("\xed\xa0\x80", 3));          /* surrogate */
	ck_assert(!dps_utf8_valid("\xf4\x90\x80\x80", 4));      /* above U+10FFFF */
	ck_assert(!dps_utf8_valid("\x80", 1));                  /* lone continuation */
	ck_assert(!dps_utf8_valid("\xff", 1));

	lossy("abc", 3, "abc");
	lossy("", 0, "");
	/* A truncated sequence is one U+FFFD, whatever its length. */
	lossy("a\xe4\xb8" "b", 4, "a" R "b");
	lossy("\xf0\x9f\x98", 3, R);
	lossy("\xe4\xb8\xe4\xb8\xad", 5, R "\xe4\xb8\xad");
	/* Lone continuation bytes: one each. */
	lossy("\x80\x80\xbf", 3, R R R);
	/* C0, C1, F5-FF lead nothing: one each, and the continuation after them too. */
	lossy("\xc0\x80", 2, R R);
	lossy("\xc1\xbf", 2, R R);
	lossy("\xf5\x80\x80\x80", 4, R R R R);
	lossy("\xff\xfe", 2, R R);
	/* Overlong E0 and F0 forms and surrogates: the second byte does not fit, so the lead
	 * byte alone is one subpart. */
	lossy("\xe0\x80\xaf", 3, R R R);
	lossy("\xf0\x80\x80\x80", 4, R R R R);
	lossy("\xed\xa0\x80", 3, R R R);
	lossy("\xed\x9f\xbf", 3, "\xed\x9f\xbf");
	/* Above U+10FFFF. */
	lossy("\xf4\x90\x80\x80", 4, R R R R);
	lossy("\xf4\x8f\xbf", 3, R);
	/* Invalid in the middle of valid text. */
	lossy("ab\xc3(cd", 6, "ab" R "(cd");
	lossy("\xe2\x82\xac\xe2\x82", 5, "\xe2\x82\xac" R);
}
END_TEST

START_TEST(test_files)
{
	struct dps_tok_hf *t;
	char err[256];

	ck_assert_int_eq(dps_tok_hf_load(&t, "/nonexistent/tokenizer.json", NULL, err, sizeof(err)),
			 -ENOENT);
	ck_assert_ptr_nonnull(strstr(err, "/nonexistent/tokenizer.json"));
}
END_TEST

int main(void)
{
	Suite *s = suite_create("tok_hf");
	TCase *tc = tcase_create("tok_hf");

	tcase_add_test(tc, test_bpe_merges);
	tcase_add_test(tc, test_bpe_unknown);
	tcase_add_test(tc, test_bpe_options);
	tcase_add_test(tc, test_refusals);
	tcase_add_test(tc, test_normalizers);
	tcase_add_test(tc, test_split_behaviours);
	tcase_add_test(tc, test_pretokenizers);
	tcase_add_test(tc, test_bytelevel);
	tcase_add_test(tc, test_metaspace);
	tcase_add_test(tc, test_long_word_pieces);
	tcase_add_test(tc, test_added_ids);
	tcase_add_test(tc, test_added_matching);
	tcase_add_test(tc, test_post);
	tcase_add_test(tc, test_config);
	tcase_add_test(tc, test_limit);
	tcase_add_test(tc, test_decoders);
	tcase_add_test(tc, test_utf8);
	tcase_add_test(tc, test_files);
	suite_add_tcase(s, tc);
	return test_run_suite(s);
}
