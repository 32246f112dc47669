/* SPDX-License-Identifier: MIT */
/*
 * tools/cmd_bench.c - `dpshard bench SUITE`: dispatch to the benchmark suites.
 */
#include <stdio.h>
#include <string.h>

#include "tools/cmd.h"

int dps_cmd_bench(int argc, char **argv)
{
	if (argc < 1 || !strcmp(argv[0], "--help") || !strcmp(argv[0], "-h")) {
		FILE *f = argc < 1 ? stderr : stdout;

		fprintf(f, "usage: dpshard bench SUITE [OPTIONS]\n\nsuites:\n"
			   "  accuracy KL divergence and top-1 agreement of --dtype bf16 against "
			   "the f32 model\n"
			   "  coll     latency and bus bandwidth of the shared-memory collectives\n"
			   "  decode   prefill and decode tokens/s of the model beside this machine's "
			   "limits\n"
			   "  serve    a load generator against a running dpshard serve (latencies, "
			   "throughput)\n"
			   "  sweep    decode over every component-size configuration of a TP x DP, "
			   "best first\n"
			   "  tokenize encode MB/s of the model's tokenizer on a long document and a "
			   "1 MiB prompt\n"
			   "\n`dpshard bench SUITE --help` describes a suite's options.\n");
		return argc < 1 ? 2 : 0;
	}
	if (!strcmp(argv[0], "accuracy"))
		return dps_bench_accuracy(argc - 1, argv + 1);
	if (!strcmp(argv[0], "coll"))
		return dps_bench_coll(argc - 1, argv + 1);
	if (!strcmp(argv[0], "decode"))
		return dps_bench_decode(argc - 1, argv + 1);
	if (!strcmp(argv[0], "serve"))
		return dps_bench_serve(argc - 1, argv + 1);
	if (!strcmp(argv[0], "sweep"))
		return dps_bench_sweep(argc - 1, argv + 1);
	if (!strcmp(argv[0], "tokenize"))
		return dps_bench_tokenize(argc - 1, argv + 1);
	fprintf(stderr, "dpshard bench: unknown suite '%s' (try dpshard bench --help)\n", argv[0]);
	return 2;
}
