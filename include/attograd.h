// attograd — a small, exact, tape-based automatic differentiation library for
// attention models, in C11 on OpenBLAS.
//
//     #include <attograd.h>
//
// The pieces, each in its own header:
//   attograd/base.h       dtypes, errors, memory accounting, threads, version
//   attograd/random.h     pcg32, the only source of randomness
//   attograd/tensor.h     tensors and initialisers
//   attograd/tape.h       the tape, backward, custom ops, printing the graph
//   attograd/data_parallel.h  a training step split over threads by the batch
//   attograd/ops.h        differentiable ops
//   attograd/params.h     parameters in one contiguous buffer
//   attograd/state.h      state kept beside parameters, as checkpoints see it
//   attograd/optim.h      SGD, Adam, AdamW, Lion, RMSprop; learning-rate schedules
//   attograd/gradcheck.h  finite-difference gradient checks
//   attograd/tape_check.h the same check node by node: which node is wrong
//   attograd/op_check.h   the checks a reviewer runs on an op, for your own ops
//   attograd/io.h         safetensors files, parameter checkpoints
//   attograd/tape_html.h  a recorded tape as a web page: values, gradients, rules, checks
//   attograd/nn.h         modules: Linear, LayerNorm, Embedding, MultiheadAttention, block
//   attograd/generate.h   sampling tokens; one position at a time against a KV cache
// and, not included here because it lives in its own library (attograd_dist, on MPI):
//   attograd/dist.h       data-parallel training over processes and machines
//
// How names are made (for users guessing a name, and for contributors adding one;
// tools/check_names.sh checks the library's symbols against it, and ctest runs it):
//   - Everything public starts with ag_ (types and functions) or AG_ (macros and
//     enum constants), and lives in include/. Internal functions shared between the
//     library's files start with agi_ and are declared in src/, never here.
//   - An op is ag_<op>, with PyTorch's name where PyTorch has the thing: ag_matmul,
//     ag_softmax, ag_masked_fill, ag_cross_entropy.
//   - Anything else is ag_<noun>_<verb>, the noun first: ag_tensor_zeros,
//     ag_tape_reset, ag_params_save, ag_optim_step, ag_op_apply. An initialiser that
//     PyTorch has in torch.nn.init fills a tensor, so it is ag_tensor_init_<PyTorch's
//     name>: ag_tensor_init_xavier_uniform is nn.init.xavier_uniform_.
//   - A getter is ag_<noun>_<property>, with no _get: ag_optim_lr, ag_tensor_item,
//     ag_tape_grad_enabled. A setter is ag_<noun>_set_<property>: ag_optim_set_lr,
//     ag_tensor_set_item, ag_tape_set_grad_enabled.
//   - A setting of the whole library is a noun of its own: ag_threads() reads it,
//     ag_threads_set(n) writes it; likewise ag_error_handler_set.
//   - C gives functions and types one namespace, so when a getter's natural name is
//     already the name of the struct it returns, the getter names what it reads:
//     ag_memory_usage() returns an ag_memory_stats, ag_tape_usage() an ag_tape_stats,
//     ag_optim_current_config() an ag_optim_config.
//   - A function that takes a va_list in place of "..." puts a v before the name, as
//     C's vprintf does: ag_verror is ag_error's.
//   - One name per thing: no aliases and no former names (attograd has had no
//     release whose callers would need them; a rename changes every caller and
//     bumps the minor version, as the README's "Versions and the ABI" says).
#ifndef ATTOGRAD_H
#define ATTOGRAD_H

#include "attograd/base.h"
#include "attograd/random.h"
#include "attograd/tensor.h"
#include "attograd/tape.h"
#include "attograd/data_parallel.h"
#include "attograd/ops.h"
#include "attograd/params.h"
#include "attograd/state.h"
#include "attograd/optim.h"
#include "attograd/gradcheck.h"
#include "attograd/tape_check.h"
#include "attograd/op_check.h"
#include "attograd/io.h"
#include "attograd/tape_html.h"
#include "attograd/nn.h"
#include "attograd/generate.h"

#endif
