// attograd/io.h — tensors in files: the safetensors format, checkpoints of a
// parameter store, and training checkpoints (parameters + the state kept
// beside them, such as an optimizer's, seen through attograd/state.h).
//
// safetensors (Hugging Face) is what PyTorch users exchange weights in:
//
//     8 bytes   N, the header length, a little-endian u64
//     N bytes   a UTF-8 JSON object, padded with spaces:
//                 {"__metadata__": {"step": "1000"},          (optional, string -> string)
//                  "linear.weight": {"dtype": "F32", "shape": [4, 8],
//                                    "data_offsets": [0, 128]}, ...}
//     the rest  the data: each tensor's bytes, little-endian, row-major, at
//               its data_offsets relative to the first byte after the header
//
// Reading trusts nothing in the file. A file loads only if all of this holds,
// and otherwise the loader returns NULL with one line in err->msg that names
// the file and the problem, e.g.
//     model.safetensors: tensor 'w': data_offsets [0,100] hold 100 bytes but F32 [4,8] needs 128
// - the file has the 8-byte length, and N fits in the file and is at most
//   100,000,000 (the limit the reference implementation uses);
// - the header is strict JSON (RFC 8259; valid UTF-8; no \u0000; nesting at
//   most 64 deep), one object that starts at its first byte, with nothing after
//   it but whitespace;
// - every tensor entry has exactly "dtype", "shape" and "data_offsets";
//   dtype is F32, F64, BOOL, U8, I32 or I64 (F16, BF16 and the other
//   safetensors dtypes are reported as unsupported); shape has at most 4
//   dimensions, each >= 1 (attograd has no empty tensors; [] is a scalar);
//   data_offsets is [begin, end] with end - begin = numel * dtype size;
// - tensors lie inside the data, cover it exactly (no holes, no overlaps, no
//   trailing bytes), and have distinct names; BOOL bytes are 0 or 1;
// - "__metadata__", if present, is an object whose values are strings.
// Loading copies every tensor out of the file; nothing stays mapped.
//
// Saving writes what the reference implementation writes for the same
// tensors (so files compare byte for byte): compact JSON with "__metadata__"
// first (keys sorted), tensors ordered by dtype alignment, largest first
// (I64, F64, F32, I32, U8, BOOL), then by name, which keeps every tensor
// aligned to its element size in the file; the header padded with spaces to
// a multiple of 8. Saving is atomic: the bytes go to a new file next to the
// target, are flushed to disk (fsync), and only then renamed over the target,
// and the directory is synced. A failure (or a crash) at any point leaves the
// previous file as it was; a failed save removes its temporary file (a
// crash can leave one behind: "<path>.tmp.<pid>.<n>", safe to delete; a file
// name longer than 229 bytes is cut there, to fit the limit of 255). A
// symbolic link at the path is replaced by the new file, not followed.
//
// File functions use POSIX (open, fsync, rename). Functions that can fail
// return 0 on success and -1 on failure (or NULL), and then fill `err`
// when it is not NULL.
#ifndef ATTOGRAD_IO_H
#define ATTOGRAD_IO_H

#include "attograd/params.h"
#include "attograd/state.h"
#include "attograd/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

// A set of named tensors and string metadata: what one safetensors file holds.
typedef struct ag_safetensors ag_safetensors;

// ---- Reading --------------------------------------------------------------------
ag_safetensors *ag_safetensors_load(const char *path, ag_err *err);
// The same from bytes in memory; `name` stands for the file in messages.
ag_safetensors *ag_safetensors_load_buffer(const void *data, size_t size, const char *name,
                                           ag_err *err);

// ---- Contents ---------------------------------------------------------------------
// Tensors are kept sorted by name (byte order). The tensors belong to the set
// (ag_tensor_free ignores them); they stay valid until the set is freed, and
// their .name is their name in the set. Integer and bool tensors are read
// through ag_tensor_item or their data (uint8_t, int32_t, int64_t). A NULL
// set reads as an empty one (what a failed load leaves behind).
int ag_safetensors_count(const ag_safetensors *st);
const char *ag_safetensors_name(const ag_safetensors *st, int i);    // NULL out of range
const ag_tensor *ag_safetensors_at(const ag_safetensors *st, int i);  // NULL out of range
const ag_tensor *ag_safetensors_find(const ag_safetensors *st, const char *name);  // NULL if absent

// Metadata, kept sorted by key.
int ag_safetensors_meta_count(const ag_safetensors *st);
const char *ag_safetensors_meta_key(const ag_safetensors *st, int i);    // NULL out of range
const char *ag_safetensors_meta_value(const ag_safetensors *st, int i);  // NULL out of range
const char *ag_safetensors_meta(const ag_safetensors *st, const char *key);  // NULL if absent

// A dtype as safetensors files spell it: "F32", "F64", "BOOL", "U8", "I32",
// "I64"; "?" for anything else. For messages about files (ag_dtype_name
// gives attograd's own "f32", "f64", ...).
const char *ag_safetensors_dtype_name(ag_dtype dt);

// ---- Building and saving -------------------------------------------------------------
ag_safetensors *ag_safetensors_new(void);
void ag_safetensors_free(ag_safetensors *st);

// Adds a copy of t's values (any dtype, any shape) under `name`. Fails if the
// name is taken, is "__metadata__", or is not valid UTF-8, or if t is BOOL and
// holds a byte other than 0 or 1 (a file's BOOL bytes are 0 or 1, as above).
int ag_safetensors_add(ag_safetensors *st, const char *name, const ag_tensor *t, ag_err *err);
// Sets (or replaces) a metadata entry; key and value must be valid UTF-8.
int ag_safetensors_set_meta(ag_safetensors *st, const char *key, const char *value,
                            ag_err *err);

int ag_safetensors_save(const ag_safetensors *st, const char *path, ag_err *err);

// ---- Any file, atomically --------------------------------------------------------------
// The atomic save every function here uses, for files of your own: the bytes
// go to "<path>.tmp.<pid>.<n>" beside the target, are flushed to disk, and
// are renamed over the target only on commit, so `path` holds the old
// contents or the new, never a mix. A write error is reported by commit.
//     ag_file_writer *w = ag_file_writer_open(path, &err);
//     if (!w) return -1;
//     ag_file_writer_write(w, text, strlen(text));   // as often as needed
//     return ag_file_writer_commit(w, &err);         // or ag_file_writer_abort(w)
// `path` must stay valid until commit or abort.
//
// Every save refuses a path that cannot name a file (NULL, "", one ending in '/', one
// where a directory is, or one where a FIFO, a device or a socket is, which the save
// would replace) or whose directory is missing, is not one, or cannot be written in,
// before it creates anything. A program that computes what it saves can ask first, and
// refuse before the work: ag_file_path_check returns 0, or -1 with one line in err.
int ag_file_path_check(const char *path, ag_err *err);
typedef struct ag_file_writer ag_file_writer;
ag_file_writer *ag_file_writer_open(const char *path, ag_err *err);
void ag_file_writer_write(ag_file_writer *w, const void *data, size_t n);
// Both free the writer; commit returns 0, or -1 (target untouched) with err.
int ag_file_writer_commit(ag_file_writer *w, ag_err *err);
void ag_file_writer_abort(ag_file_writer *w);

// ---- Parameter stores ------------------------------------------------------------------
// A checkpoint is the store's parameters under their names, in the store's
// dtype, like a PyTorch state_dict saved with safetensors.torch.save_file.
//
// Saves every parameter, plus metadata given as NULL-terminated key, value
// pairs (or NULL), atomically:
//     ag_params_save(ps, "ckpt.safetensors", (const char *[]){"step", "1000", NULL}, &err);
// The same as ag_checkpoint_save(ps, NULL, ...): metadata keys "optimizer"
// and "optimizer.*" are reserved.
int ag_params_save(const ag_params *ps, const char *path, const char *const meta[],
                   ag_err *err);

// Loads parameter values strictly, as PyTorch's load_state_dict(strict=True):
// every parameter must be in the file, the file must hold no other tensor
// (metadata is fine), shapes must be equal, and tensors must be F32 or F64;
// an F32 file loads into an f64 store and vice versa, converting each value
// (f64 -> f32 rounds to nearest). Everything is checked before any value is
// written, so a failed load leaves the store untouched. Gradients are not
// touched. The message lists what is missing, unexpected or mismatched.
int ag_params_load(ag_params *ps, const char *path, ag_err *err);

// The same from a set, for tensors named `prefix` + parameter name: strict
// about the tensors that start with `prefix`, blind to all others. So one
// file can hold several models, or a model and its optimizer state:
//     ag_safetensors_add_params(st, encoder, "encoder.", &err);
//     ag_safetensors_add_params(st, decoder, "decoder.", &err);
//     ...
//     ag_params_load_from(encoder, st, "encoder.", &err);
// (A prefix that is a prefix of another, as "enc" and "encoder.", sees both.)
int ag_params_load_from(ag_params *ps, const ag_safetensors *st, const char *prefix,
                        ag_err *err);
// Adds copies of every parameter, named `prefix` + name (prefix may be NULL).
int ag_safetensors_add_params(ag_safetensors *st, const ag_params *ps, const char *prefix,
                              ag_err *err);

// ---- Training checkpoints ------------------------------------------------------------
// Everything a run needs to go on as if it had never stopped, bit for bit:
// the parameters, the state kept beside them (an optimizer's: its buffers,
// step count, learning rate; see ag_optim_state in optim.h), and your
// metadata (epoch, data position, ...), in one safetensors file laid out so
// that it means the same thing in PyTorch:
//     "<param>"                     each parameter, as ag_params_save writes it
//     "optimizer.<buffer>.<param>"  the parameter's slice of each state buffer,
//                                   with its shape and dtype ("exp_avg",
//                                   "momentum_buffer": PyTorch's state keys)
//     __metadata__                  "optimizer": the state's kind ("adam");
//                                   "optimizer.<key>": each of its settings, as
//                                   the state writes them ("optimizer.step",
//                                   "optimizer.lr", "optimizer.no_decay": see
//                                   ag_optim_state in optim.h); and your keys.
// In Python, the model part loads with
//     sd = safetensors.torch.load_file("ckpt.safetensors")
//     model.load_state_dict({k: v for k, v in sd.items() if not k.startswith("optimizer.")})
//
// Saves the parameters of `ps` and, when `state` is not NULL, the state (of
// `ps`, made after its last ag_params_add or ag_params_resize: one that no longer
// fits the store is refused, on load too), with metadata as NULL-terminated
// key, value pairs (or NULL); keys "optimizer" and "optimizer.*" are
// reserved, and so, with a state, are parameter names starting with
// "optimizer.". Atomic, as every save here: a failed save leaves the
// previous checkpoint as it was. The state's numbers take '.' whatever the locale
// (setlocale), so a checkpoint reads back in any program.
//     ag_checkpoint_save(ps, ag_optim_state(opt), "run.safetensors",
//                        (const char *[]){"epoch", "3", NULL}, &err);
int ag_checkpoint_save(const ag_params *ps, const ag_state *state, const char *path,
                       const char *const meta[], ag_err *err);

// Restores the parameters of `ps` and, when `state` is not NULL, its buffers
// and the settings it restores (an optimizer: step count, learning rate, decay groups),
// so that the next step is the one the saved run would have taken.
//
// Everything is checked before anything is written, so a failed load leaves
// the parameters and the state untouched; the message names the file and
// the problem:
//   - the parameters as ag_params_load checks them (all present, F32 or F64
//     with their shapes, no other tensor), except that tensors under
//     "optimizer." belong to the state;
//   - with `state`: the file has state (a model-only file is refused: pass
//     NULL to load just its parameters) of the same kind ("the file holds
//     adam optimizer state but the optimizer is sgd"); the state accepts the
//     file's settings; every buffer tensor is there with its parameter's shape
//     (F32 or F64, converted), and no other "optimizer." tensor. A buffer the
//     file's settings say was not made yet (ag_state_source.may_lack: SGD's
//     momentum_buffer before its first step) may be left out whole, and is
//     then zeroed.
// With `state` NULL the state's part of the file is ignored: the weights of a
// training checkpoint load for evaluation.
//
// When `file` is not NULL it receives the loaded file on success (read your
// metadata with ag_safetensors_meta(*file, "epoch"); free it with
// ag_safetensors_free), and NULL on failure.
int ag_checkpoint_load(ag_params *ps, ag_state *state, const char *path, ag_safetensors **file,
                       ag_err *err);

#ifdef __cplusplus
}
#endif
#endif
