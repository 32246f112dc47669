/* SPDX-License-Identifier: MIT */
/*
 * tools/main.c - the dpshard command: dispatches to the subcommands in tools/cmd.h.
 */
#include <stdio.h>
#include <string.h>

#include "config.h"
#include "engine/runtime/xlink.h"
#include "tools/cmd.h"

static const struct {
	const char *name;
	int (*fn)(int argc, char **argv);
	const char *help;
} commands[] = {
	{ "groups", dps_cmd_groups, "print the rank grid and every process group of a TP x DP layout" },
	{ "generate", dps_cmd_generate,
	  "generate text: in one process, or across ranks on the serving engine" },
	{ "serve", dps_cmd_serve, "serve a model over an OpenAI-compatible HTTP API (systemd-ready)" },
	{ "tokenize", dps_cmd_tokenize, "the token ids of a text, with the model's tokenizer" },
	{ "detokenize", dps_cmd_detokenize, "the text of token ids, with the model's tokenizer" },
	{ "bench", dps_cmd_bench, "benchmarks, one suite per line below" },
	{ "convert", dps_cmd_convert,
	  "import a llama2.c checkpoint and tokenizer; export a model as GGUF for llama.cpp" },
	{ "mkmodel", dps_cmd_mkmodel,
	  "write a seeded random model of any Llama shape, or an Eagle3 draft of a model" },
	{ "quantize", dps_cmd_quantize,
	  "write an INT8 checkpoint of a model (linear weights and LM head, blocks of 32)" },
};

/* The suites of `bench` (tools/cmd_bench.c dispatches them), listed under it. */
static const struct {
	const char *name, *help;
} bench_suites[] = {
	{ "bench accuracy", "KL divergence and top-1 agreement of BF16 or INT8 weights against f32" },
	{ "bench coll", "latency and bus bandwidth of the shared-memory collectives" },
	{ "bench decode", "prefill and decode tokens/s of a model, beside this machine's limits" },
	{ "bench sweep", "bench decode over every component-size configuration of a TP x DP" },
	{ "bench serve", "a load generator against a running dpshard serve, as vllm bench serve" },
	{ "bench tokenize", "encode MB/s of the model's tokenizer on a long document and a 1 MiB prompt" },
};

static void usage(FILE *f)
{
	fprintf(f, "usage: dpshard COMMAND [OPTIONS]\n\n"
		   "dpshard runs the decode path of a Trainium vLLM deployment on one Linux machine,\n"
		   "one process per rank, with shared-memory collectives.\n\ncommands:\n");
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
		fprintf(f, "  %-14s %s\n", commands[i].name, commands[i].help);
		if (commands[i].fn == dps_cmd_bench)
			for (size_t j = 0; j < sizeof(bench_suites) / sizeof(bench_suites[0]); j++)
				fprintf(f, "  %-14s %s\n", bench_suites[j].name, bench_suites[j].help);
	}
	fprintf(f, "\nWithout --model, generate and serve use stories260K, the small trained model\n"
		   "that comes with dpshard.\n"
		   "\n`dpshard COMMAND --help` describes a command's options.\n"
		   "`dpshard --version` prints the version.\n");
}

int main(int argc, char **argv)
{
#ifdef HAVE_MPI
	dps_xlink_mpi_register(); /* --nodes under mpirun */
#endif
	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
		usage(stdout);
		return 0;
	}
	if (!strcmp(argv[1], "--version")) {
		printf("dpshard %s\n", PACKAGE_VERSION);
		return 0;
	}
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		if (!strcmp(argv[1], commands[i].name))
			return commands[i].fn(argc - 2, argv + 2);
	fprintf(stderr, "dpshard: unknown command '%s' (try dpshard --help)\n", argv[1]);
	return 2;
}
