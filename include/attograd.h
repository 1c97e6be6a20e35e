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
//   attograd/optim.h      SGD, Adam, AdamW; learning-rate schedules
//   attograd/gradcheck.h  finite-difference gradient checks
//   attograd/data.h       synthetic sequence tasks: generate, save/load, batches
//   attograd/io.h         safetensors files, parameter checkpoints
//   attograd/nn.h         modules: Linear, LayerNorm, Embedding, MultiheadAttention, block
//   attograd/generate.h   sampling tokens; one position at a time against a KV cache
#ifndef ATTOGRAD_H
#define ATTOGRAD_H

#include "attograd/base.h"
#include "attograd/random.h"
#include "attograd/tensor.h"
#include "attograd/tape.h"
#include "attograd/ops.h"
#include "attograd/params.h"
#include "attograd/optim.h"
#include "attograd/gradcheck.h"
#include "attograd/data.h"
#include "attograd/io.h"
#include "attograd/nn.h"
#include "attograd/generate.h"

#endif
