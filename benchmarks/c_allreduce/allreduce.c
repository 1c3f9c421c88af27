/*
 * Reference MPI_Allreduce benchmark in C, timed the way IMB-MPI1's Allreduce is, to check what
 * microbench's Python (mpi4py) Allreduce measures against the same MPI library.
 *
 * For each message size (powers of two from --min to --max bytes, float32, MPI_SUM, separate
 * send and receive buffers):
 *   repetitions = min(1000, 40 MiB / bytes), at least 1   (IMB's MSGSPERSAMPLE, OVERALL_VOL)
 *   one untimed warm-up loop of max(1, repetitions / 10) calls
 *   --samples times: MPI_Barrier; t0 = MPI_Wtime(); repetitions x MPI_Allreduce;
 *                    t = (MPI_Wtime() - t0) / repetitions; sample = max over ranks of t
 * and prints, on rank 0, one line per size: bytes repetitions median min max (seconds, over
 * the samples).
 *
 * --thread-level single|funneled|serialized|multiple: what MPI_Init_thread asks for (default
 * multiple, what mpi4py asks for by default; IMB calls MPI_Init, which is single in MPICH). With
 * MPI_THREAD_MULTIPLE, MPICH takes a lock in every call, which costs small messages.
 *
 * --off-cache BYTES (IMB's -off_cache): rotate through enough buffer copies, each on its own
 * cache lines, that one pass touches at least 2 x BYTES (pass the last-level cache size), so
 * consecutive calls do not find their buffers in cache. 0 (default, IMB's default too): one
 * buffer pair, reused.
 *
 * Buffers of 4 MiB and more are madvise(MADV_HUGEPAGE)d, as numpy does for its arrays on Linux:
 * where transparent huge pages are in "madvise" mode, this is what decides whether a large
 * buffer gets 2 MiB pages, which changes large-message times by 10-20%, so both sides must agree.
 *
 * Build: mpicc -O2 -o allreduce allreduce.c    Run: mpiexec -n 2 ./allreduce --max 67108864
 *
 * Built with -DALLREDUCE_LIBRARY -shared -fPIC instead, there is no main and
 * allreduce_sample_world() times one sample on MPI_COMM_WORLD, so that a Python process can take
 * C and Python samples alternately on the same buffers (benchmarks/compare_allreduce.py).
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define MSGS_PER_SAMPLE 1000
#define OVERALL_VOL (40L * 1048576L)
#define CACHE_LINE 64L
#define HUGEPAGE_FROM_BYTES (4L << 20) /* numpy's threshold for madvise(MADV_HUGEPAGE) */

/* One sample: barrier, `reps` calls timed as a whole, max over ranks of the per-call average.
 * Call i uses buffer copy i % copies, `step` floats apart. */
double allreduce_sample(const float *send, float *recv, long count, long reps, long copies,
                        long step, MPI_Comm comm) {
    double t, t_max;
    MPI_Barrier(comm);
    double t0 = MPI_Wtime();
    for (long i = 0; i < reps; i++)
        MPI_Allreduce(send + (i % copies) * step, recv + (i % copies) * step, (int)count,
                      MPI_FLOAT, MPI_SUM, comm);
    t = (MPI_Wtime() - t0) / (double)reps;
    MPI_Allreduce(&t, &t_max, 1, MPI_DOUBLE, MPI_MAX, comm);
    return t_max;
}

double allreduce_sample_world(const float *send, float *recv, long count, long reps,
                              long copies, long step) {
    return allreduce_sample(send, recv, count, reps, copies, step, MPI_COMM_WORLD);
}

#ifndef ALLREDUCE_LIBRARY
/* malloc, then ask for huge pages the way numpy's allocator does (before the first touch). */
static void *alloc_like_numpy(size_t bytes) {
    char *p = malloc(bytes);
#ifdef MADV_HUGEPAGE
    if (p != NULL && bytes >= (size_t)HUGEPAGE_FROM_BYTES) {
        size_t offset = 4096 - (size_t)p % 4096;
        madvise(p + offset, bytes - offset, MADV_HUGEPAGE);
    }
#endif
    return p;
}

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static long parse_long(const char *text, const char *flag) {
    char *end;
    long value = strtol(text, &end, 10);
    if (*text == '\0' || *end != '\0' || value < 0) {
        fprintf(stderr, "allreduce: %s needs a non-negative integer, got '%s'\n", flag, text);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    return value;
}

static int thread_level(int argc, char **argv) {
    static const char *names[] = {"single", "funneled", "serialized", "multiple"};
    static const int levels[] = {MPI_THREAD_SINGLE, MPI_THREAD_FUNNELED, MPI_THREAD_SERIALIZED,
                                 MPI_THREAD_MULTIPLE};
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], "--thread-level") == 0)
            for (int k = 0; k < 4; k++)
                if (strcmp(argv[i + 1], names[k]) == 0) return levels[k];
    return MPI_THREAD_MULTIPLE;
}

int main(int argc, char **argv) {
    long min_bytes = 8, max_bytes = 64L << 20, off_cache_bytes = 0;
    int samples = 7, rank, ranks, provided;

    MPI_Init_thread(&argc, &argv, thread_level(argc, argv), &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    for (int i = 1; i < argc; i++) {
        if (i + 1 < argc && strcmp(argv[i], "--min") == 0) {
            min_bytes = parse_long(argv[++i], "--min");
        } else if (i + 1 < argc && strcmp(argv[i], "--max") == 0) {
            max_bytes = parse_long(argv[++i], "--max");
        } else if (i + 1 < argc && strcmp(argv[i], "--samples") == 0) {
            samples = (int)parse_long(argv[++i], "--samples");
        } else if (i + 1 < argc && strcmp(argv[i], "--off-cache") == 0) {
            off_cache_bytes = parse_long(argv[++i], "--off-cache");
        } else if (i + 1 < argc && strcmp(argv[i], "--thread-level") == 0) {
            i++; /* read before MPI_Init_thread */
        } else {
            if (rank == 0)
                fprintf(stderr, "usage: allreduce [--min B] [--max B] [--samples K] "
                                "[--off-cache B] [--thread-level L]\n");
            MPI_Finalize();
            return 2;
        }
    }
    if (min_bytes < 4 || min_bytes % 4 || max_bytes < min_bytes || samples < 1) {
        if (rank == 0)
            fprintf(stderr, "allreduce: need 4 <= --min (a multiple of 4) <= --max, "
                            "--samples >= 1\n");
        MPI_Finalize();
        return 2;
    }

    double *times = malloc(sizeof(double) * samples);
    if (rank == 0)
        printf("# bytes repetitions median_s min_s max_s (ranks %d, off_cache %ld, "
               "thread level provided %d)\n",
               ranks, off_cache_bytes, provided);
    for (long bytes = min_bytes; bytes <= max_bytes; bytes *= 2) {
        long count = bytes / 4;
        long reps = OVERALL_VOL / bytes;
        if (reps > MSGS_PER_SAMPLE) reps = MSGS_PER_SAMPLE;
        if (reps < 1) reps = 1;
        long stride = (bytes + CACHE_LINE - 1) / CACHE_LINE * CACHE_LINE; /* in bytes */
        long copies = 1;
        if (off_cache_bytes > 0) {
            copies = (2 * off_cache_bytes + stride - 1) / stride;
            if (copies > reps) copies = reps;
            if (copies < 1) copies = 1;
        }
        float *send = alloc_like_numpy((size_t)(copies * stride));
        float *recv = alloc_like_numpy((size_t)(copies * stride));
        if (send == NULL || recv == NULL) {
            fprintf(stderr, "allreduce: out of memory at %ld bytes\n", bytes);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        long floats = copies * stride / 4;
        for (long i = 0; i < floats; i++) { /* touch every page before timing */
            send[i] = (float)(rank + 1);
            recv[i] = -1.0f;
        }
        long step = stride / 4; /* floats between copies */

        long warmup = reps / 10 > 1 ? reps / 10 : 1;
        for (long i = 0; i < warmup; i++)
            MPI_Allreduce(send + (i % copies) * step, recv + (i % copies) * step, (int)count,
                          MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        float expected = (float)ranks * (float)(ranks + 1) / 2.0f;
        int ok = 1;
        for (long i = 0; i < count; i++) ok &= recv[i] == expected;
        int all_ok;
        MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
        if (!all_ok) {
            if (rank == 0) fprintf(stderr, "allreduce: wrong result at %ld bytes\n", bytes);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }

        for (int s = 0; s < samples; s++)
            times[s] = allreduce_sample(send, recv, count, reps, copies, step, MPI_COMM_WORLD);
        if (rank == 0) {
            qsort(times, samples, sizeof(double), compare_doubles);
            double median = samples % 2 ? times[samples / 2]
                                        : (times[samples / 2 - 1] + times[samples / 2]) / 2.0;
            printf("%ld %ld %.9e %.9e %.9e\n", bytes, reps, median, times[0], times[samples - 1]);
            fflush(stdout);
        }
        free(send);
        free(recv);
    }
    free(times);
    MPI_Finalize();
    return 0;
}
#endif
