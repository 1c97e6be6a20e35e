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
//   attograd/ops.h        differentiable ops
//   attograd/params.h     parameters in one contiguous buffer
//   attograd/state.h      state kept beside parameters, as checkpoints see it
//   attograd/optim.h      SGD, Adam, AdamW, Lion; learning-rate schedules
//   attograd/gradcheck.h  finite-difference gradient checks
//   attograd/tape_check.h the same check node by node: which node is wrong
//   attograd/op_check.h   the checks a reviewer runs on an op, for your own ops
//   attograd/io.h         safetensors files, parameter checkpoints
//   attograd/tape_html.h  a recorded tape as a web page: values, gradients, rules, checks
//   attograd/nn.h         modules: Linear, LayerNorm, Embedding, MultiheadAttention, block
//   attograd/generate.h   sampling tokens; one position at a time against a KV cache
// and, not included here because it lives in its own library (attograd_dist, on MPI):
//   attograd/dist.h       data-parallel training over processes and machines
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
