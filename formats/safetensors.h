/* safetensors.h - reader (mmap) and streaming writer for safetensors files.
 *
 * Layout, byte by byte:
 *   [0, 8)          N: unsigned 64-bit little-endian, length of the header
 *   [8, 8+N)        header: UTF-8 JSON object (may be right-padded with
 *                   spaces); each key is a tensor name mapping to
 *                   {"dtype": "BF16"|"F16"|"F32"|"I8"|"U8"|"I32"|"I64",
 *                    "shape": [d0, d1, ...], "data_offsets": [begin, end]},
 *                   plus an optional "__metadata__" object of string values
 *   [8+N, EOF)      data; offsets are relative to 8+N
 * Reader checks: N <= SFW_ST_HEADER_MAX and 8+N <= file size; strict JSON
 * (duplicate names rejected); known dtype; shape product x dtype size ==
 * end-begin (overflow-checked); begin <= end <= data size; tensors do not
 * overlap; every byte of the data section belongs to some tensor is NOT
 * required (padding is allowed). Also required: the data of every non-empty
 * tensor starts at a file offset that is a multiple of its element size (the
 * engine reads weights in place; the reference writer's 8-byte header padding
 * and dtype ordering guarantee it), else SFW_E_UNSUPPORTED. Tensor entries
 * may hold only dtype, shape and data_offsets.
 *
 * A model with several shards is opened through model.safetensors.index.json
 * ({"weight_map": {name: shard file}}); shard names must be plain file names.
 * The set holds exactly the weight_map's tensors: each must be in the shard
 * the index names (tensors of a shard that the index omits are not in the set).
 * Writer: a declaration that would leave a tensor unaligned (e.g. f32 after an
 * odd number of bf16 elements) is refused: declare larger element types first. */
#ifndef SFW_SAFETENSORS_H
#define SFW_SAFETENSORS_H

#include "file.h"
#include "num/num.h" /* enum sfw_dtype; bf16/f16 conversions */
#include "sfw.h"

#include <stdint.h>

#define SFW_ST_HEADER_MAX (100u << 20) /* 100 MiB, as in the reference library */
#define SFW_ST_MAX_DIMS 8

/* Bytes per element ("W8": 1, a code byte; 0 when out of range) and the
 * name as a header spells it ("BF16"; "W8" is no safetensors dtype: the
 * reader and the writer refuse it). */
size_t sfw_dtype_size(enum sfw_dtype t);
const char *sfw_dtype_name(enum sfw_dtype t);

struct sfw_tensor_info {
	const char *name;          /* valid until the file/set is closed */
	enum sfw_dtype dtype;
	int ndim;
	uint64_t shape[SFW_ST_MAX_DIMS];
	uint64_t nelem;
	const void *data;          /* into the read-only map */
	uint64_t nbytes;
};

struct sfw_st_file; /* one mapped file */

SFW_MUST_CHECK enum sfw_status sfw_st_open(const char *path, struct sfw_st_file **out, struct sfw_err *err);
/* Parses a header from memory (fuzz entry point): buf holds the whole file. */
SFW_MUST_CHECK enum sfw_status sfw_st_parse(const unsigned char *buf, uint64_t size, const char *what,
					    struct sfw_st_file **out, struct sfw_err *err);
void sfw_st_close(struct sfw_st_file *f);
size_t sfw_st_count(const struct sfw_st_file *f);
const struct sfw_tensor_info *sfw_st_at(const struct sfw_st_file *f, size_t i);
const struct sfw_tensor_info *sfw_st_find(const struct sfw_st_file *f, const char *name);
/* __metadata__ value or NULL. */
const char *sfw_st_metadata(const struct sfw_st_file *f, const char *key);

/* A model directory: model.safetensors.index.json + shards, or one
 * model.safetensors. Lookups span all shards. */
struct sfw_st_set;
SFW_MUST_CHECK enum sfw_status sfw_st_set_open(const char *dir, struct sfw_st_set **out, struct sfw_err *err);
void sfw_st_set_close(struct sfw_st_set *s);
size_t sfw_st_set_count(const struct sfw_st_set *s);
const struct sfw_tensor_info *sfw_st_set_at(const struct sfw_st_set *s, size_t i);
const struct sfw_tensor_info *sfw_st_set_find(const struct sfw_st_set *s, const char *name);
/* Finds name and checks dtype and shape (ndim dims); a clear error otherwise. */
SFW_MUST_CHECK enum sfw_status sfw_st_set_expect(const struct sfw_st_set *s, const char *name,
						 enum sfw_dtype dtype, int ndim, const uint64_t *shape,
						 const struct sfw_tensor_info **out, struct sfw_err *err);

/* Streaming writer: declare every tensor first (name, dtype, shape), then
 * write their data in declaration order, in as many pieces as wanted; commit
 * checks every byte was written, then fsyncs and renames the temp file. */
struct sfw_st_writer;
SFW_MUST_CHECK enum sfw_status sfw_st_writer_new(const char *path, struct sfw_st_writer **out,
						 struct sfw_err *err);
SFW_MUST_CHECK enum sfw_status sfw_st_writer_meta(struct sfw_st_writer *w, const char *key, const char *value,
						  struct sfw_err *err);
SFW_MUST_CHECK enum sfw_status sfw_st_writer_declare(struct sfw_st_writer *w, const char *name,
						     enum sfw_dtype dtype, int ndim, const uint64_t *shape,
						     struct sfw_err *err);
SFW_MUST_CHECK enum sfw_status sfw_st_writer_write(struct sfw_st_writer *w, const void *p, size_t n,
						   struct sfw_err *err);
SFW_MUST_CHECK enum sfw_status sfw_st_writer_commit(struct sfw_st_writer *w, struct sfw_err *err);
/* Frees the writer; removes the temp file unless committed. NULL is a no-op. */
void sfw_st_writer_free(struct sfw_st_writer *w);

#endif
