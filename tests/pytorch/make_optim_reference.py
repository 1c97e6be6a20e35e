"""Writes tests/reference/optim_reference.h: what torch.optim (1.13) does to a
small set of parameters under a fixed sequence of gradients, for tests/test_optim.c;
and Lion, which torch.optim lacks, written here in torch ops (class Lion). Also
writes, for the cases in BEFORE_FIRST_STEP, tests/reference/optim_<case>_step0.safetensors:
the parameters and the optimizer's state_dict before its first step (PyTorch has
made no buffer yet), in the layout of an attograd training checkpoint.

Run by hand, never by CI:
    /usr/bin/python3 tests/pytorch/make_optim_reference.py

Every case replays the same parameters and gradients for STEPS steps through
torch.optim's single-tensor code path (foreach=False), once in float64 and once
in float32, and records the parameters after every step. The gradients come
from torch.manual_seed, are rounded to float64, and are written out, so the C
test needs nothing but the header. One element of the last parameter has a
zero gradient on every step (Adam then divides 0 by eps; SGD leaves it alone).
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import safetensors_io as sio  # noqa: E402

STEPS = 5
# PyTorch state_dict-style names and shapes; in the C store these are laid
# out with zero padding between them.
PARAMS = [("attn.in_proj_weight", [2, 3]), ("attn.in_proj_bias", [3]), ("norm.weight", [5])]

# name, optimizer class name, lr on each step, keyword arguments.
CASES = [
    ("sgd_plain", "SGD", [0.1] * STEPS, dict()),
    ("sgd_momentum_dampening_weight_decay", "SGD", [0.1] * STEPS,
     dict(momentum=0.9, dampening=0.1, weight_decay=0.01)),
    ("sgd_nesterov", "SGD", [0.1] * STEPS, dict(momentum=0.9, nesterov=True, weight_decay=0.01)),
    ("adam", "Adam", [0.01] * STEPS, dict()),
    ("adam_weight_decay", "Adam", [0.01] * STEPS,
     dict(betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)),
    ("adamw", "AdamW", [0.01] * STEPS, dict(weight_decay=0.1)),
    ("adamw_changing_lr", "AdamW", [0.002, 0.01, 0.02, 0.015, 0.005], dict()),
    ("lion", "Lion", [0.01] * STEPS, dict()),
    ("lion_weight_decay_changing_lr", "Lion", [0.002, 0.01, 0.02, 0.015, 0.005],
     dict(betas=(0.8, 0.95), weight_decay=0.5)),
    ("rmsprop", "RMSprop", [0.01] * STEPS, dict()),
    ("rmsprop_momentum_weight_decay", "RMSprop", [0.01] * STEPS,
     dict(alpha=0.9, eps=1e-6, momentum=0.8, weight_decay=0.1)),
    ("rmsprop_centered", "RMSprop", [0.01] * STEPS, dict(centered=True)),
    ("rmsprop_centered_momentum_changing_lr", "RMSprop", [0.002, 0.01, 0.02, 0.015, 0.005],
     dict(alpha=0.95, momentum=0.9, centered=True, weight_decay=0.01)),
]

# The cases whose optimizer is also saved before its first step, as a checkpoint.
BEFORE_FIRST_STEP = ["sgd_momentum_dampening_weight_decay", "sgd_nesterov", "adam",
                     "rmsprop_centered_momentum_changing_lr"]
# The hyperparameters of a param_group, as attograd's checkpoints name them.
SETTINGS = ["lr", "weight_decay", "momentum", "dampening", "nesterov", "eps", "alpha",
            "centered"]


class Lion(torch.optim.Optimizer):
    """Lion (Chen et al. 2023, Program 1), which torch 1.13 lacks, in torch
    ops in the order of lion-pytorch's update_fn; sign(0) = 0."""

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0, foreach=False):
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            lr, wd = group["lr"], group["weight_decay"]
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                state = self.state[p]
                if "exp_avg" not in state:
                    state["exp_avg"] = torch.zeros_like(p)
                exp_avg, grad = state["exp_avg"], p.grad
                p.mul_(1 - lr * wd)
                update = exp_avg.clone().mul_(beta1).add(grad, alpha=1 - beta1).sign_()
                p.add_(update, alpha=-lr)
                exp_avg.mul_(beta2).add_(grad, alpha=1 - beta2)


def optimizer_class(name):
    return Lion if name == "Lion" else getattr(torch.optim, name)

# Gradient clipping by global norm: max_norm values (one clips, one does not).
CLIP_MAX_NORMS = [1.0, 100.0]


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def make_inputs():
    gen = torch.Generator().manual_seed(20240613)
    init = [torch.randn(shape, generator=gen, dtype=torch.float64) for _, shape in PARAMS]
    grads = []
    for _ in range(STEPS):
        step = [torch.randn(shape, generator=gen, dtype=torch.float64) for _, shape in PARAMS]
        step[-1].view(-1)[0] = 0.0
        grads.append(step)
    clip_grads = [torch.randn(shape, generator=gen, dtype=torch.float64) for _, shape in PARAMS]
    return init, grads, clip_grads


def run_case(cls_name, lrs, kwargs, init, grads, dtype):
    params = [p.clone().to(dtype).requires_grad_(True) for p in init]
    opt = optimizer_class(cls_name)(params, lr=lrs[0], foreach=False, **kwargs)
    trajectory = []
    for step in range(STEPS):
        for group in opt.param_groups:
            group["lr"] = lrs[step]
        for p, g in zip(params, grads[step]):
            p.grad = g.clone().to(dtype)
        opt.step()
        trajectory.append(flat(params))
    # The optimizer's state after the last step, one flat list per buffer, in the
    # order PyTorch made them.
    keys = [k for k, v in opt.state[params[0]].items() if k != "step" and v is not None]
    state = [flat([opt.state[p][k] for p in params]) for k in keys]
    return trajectory, state


def setting_text(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    return repr(float(v))


def save_before_first_step(cls_name, lrs, kwargs, init, path):
    """The case's parameters (float64) and its fresh optimizer as an attograd
    training checkpoint, translated from PyTorch's state_dict: a tensor
    optimizer.<key>.<param> for each state tensor (none before the first step),
    and optimizer.<setting> for the param_group's hyperparameters."""
    params = [p.clone().requires_grad_(True) for p in init]
    opt = optimizer_class(cls_name)(params, lr=lrs[0], foreach=False, **kwargs)
    sd = opt.state_dict()
    group = sd["param_groups"][0]
    names = [n for n, _ in PARAMS]
    tensors = {n: p.detach() for n, p in zip(names, params)}
    for index, state in sd["state"].items():
        for key, value in state.items():
            if key != "step" and value is not None:
                tensors["optimizer.%s.%s" % (key, names[index])] = value
    meta = {"optimizer": cls_name.lower(), "optimizer.step": "0"}
    for key in SETTINGS:
        if key in group:
            meta["optimizer." + key] = setting_text(group[key])
    if "betas" in group:
        meta["optimizer.beta1"] = setting_text(group["betas"][0])
        meta["optimizer.beta2"] = setting_text(group["betas"][1])
    if cls_name == "SGD":
        made = [sd["state"].get(i, {}).get("momentum_buffer") is not None
                for i in range(len(params))]
        meta["optimizer.momentum_initialised"] = "true" if all(made) else "false"
    sio.save(tensors, path, meta)


def run_clip(clip_grads, max_norm, dtype):
    params = [torch.zeros_like(g, dtype=dtype, requires_grad=True) for g in clip_grads]
    for p, g in zip(params, clip_grads):
        p.grad = g.clone().to(dtype)
    total = torch.nn.utils.clip_grad_norm_(params, max_norm)
    return total.item(), [x for p in params for x in p.grad.reshape(-1).tolist()]


def flat(tensors):
    return [x for t in tensors for x in t.detach().reshape(-1).tolist()]


def c(x):
    # repr() is the shortest decimal that reads back to the same double.
    return repr(float(x))


def c_list(xs, column):
    # A braced initialiser whose "{" sits at `column`, wrapped to 100 columns.
    items = [c(x) for x in xs]
    lines, line = [], ""
    for i, item in enumerate(items):
        item += "," if i + 1 < len(items) else "}"
        if line and column + 1 + len(line) + 1 + len(item) > 100:
            lines.append(line)
            line = item
        else:
            line = line + " " + item if line else item
    lines.append(line)
    return "{" + ("\n" + " " * (column + 1)).join(lines)


def main():
    init, grads, clip_grads = make_inputs()
    total = sum(numel(s) for _, s in PARAMS)
    out = []
    w = out.append
    w("// GENERATED by tests/pytorch/make_optim_reference.py with torch %s: do not edit." % torch.__version__)
    w("// Regenerate (by hand, never in CI) from the repository root with:")
    w("//     /usr/bin/python3 tests/pytorch/make_optim_reference.py")
    w("// Parameters after each of %d steps of torch.optim (single-tensor path, foreach=False)," % STEPS)
    w("// run in float64 and in float32 from the same float64 inputs; and")
    w("// torch.nn.utils.clip_grad_norm_ on one set of gradients.")
    w("#ifndef OPTIM_REFERENCE_H")
    w("#define OPTIM_REFERENCE_H")
    w("")
    w("#include \"attograd/optim.h\"")
    w("")
    w("#define OPTREF_STEPS %d" % STEPS)
    w("#define OPTREF_PARAMS %d" % len(PARAMS))
    w("#define OPTREF_NUMEL %d  // all parameters concatenated, no padding" % total)
    w("")
    w("static const char *const optref_names[OPTREF_PARAMS] = {")
    w("    %s};" % ", ".join('"%s"' % n for n, _ in PARAMS))
    w("static const int optref_ndim[OPTREF_PARAMS] = {%s};" % ", ".join(str(len(s)) for _, s in PARAMS))
    w("static const int optref_shape[OPTREF_PARAMS][2] = {%s};" %
      ", ".join("{%s}" % ", ".join(str(d) for d in (s + [1])[:2]) for _, s in PARAMS))
    w("")
    w("static const double optref_init[OPTREF_NUMEL] =")
    w("    %s;" % c_list(flat(init), 4))
    w("")
    w("static const double optref_grads[OPTREF_STEPS][OPTREF_NUMEL] = {")
    for step in grads:
        w("    %s," % c_list(flat(step), 4))
    w("};")
    w("")
    w("typedef struct optref_case {")
    w("    const char *name;")
    w("    ag_optim_kind kind;")
    w("    double lr[OPTREF_STEPS];  // set before each step")
    w("    double momentum, dampening, weight_decay, beta1, beta2, eps, alpha;")
    w("    bool nesterov, centered;")
    w("    double f64[OPTREF_STEPS][OPTREF_NUMEL];  // parameters after each step, float64 run")
    w("    double f32[OPTREF_STEPS][OPTREF_NUMEL];  // the same, float32 run")
    w("    int n_state;  // optimizer state buffers after the last step, float64 run:")
    w("    double state[3][OPTREF_NUMEL];  // in PyTorch's order (ag_optim_state_name)")
    w("} optref_case;")
    w("")
    w("static const optref_case optref_cases[] = {")
    kinds = {"SGD": "AG_SGD", "Adam": "AG_ADAM", "AdamW": "AG_ADAMW", "Lion": "AG_LION",
             "RMSprop": "AG_RMSPROP"}
    for name, cls_name, lrs, kwargs in CASES:
        # Every hyperparameter as the optimizer object resolved it (defaults included).
        probe = optimizer_class(cls_name)([torch.zeros(1, requires_grad=True)], lr=lrs[0], **kwargs)
        hp = probe.param_groups[0]
        betas = hp.get("betas", (0.0, 0.0))
        f64, state = run_case(cls_name, lrs, kwargs, init, grads, torch.float64)
        f32, _ = run_case(cls_name, lrs, kwargs, init, grads, torch.float32)
        w("    {\"%s\", %s, %s," % (name, kinds[cls_name], c_list(lrs, 0)))
        w("     %s, %s, %s, %s, %s, %s, %s, %s, %s," % (
            c(hp.get("momentum", 0.0)), c(hp.get("dampening", 0.0)), c(hp["weight_decay"]),
            c(betas[0]), c(betas[1]), c(hp.get("eps", 0.0)), c(hp.get("alpha", 0.0)),
            "true" if hp.get("nesterov", False) else "false",
            "true" if hp.get("centered", False) else "false"))
        w("     {")
        for row in f64:
            w("         %s," % c_list(row, 9))
        w("     },")
        w("     {")
        for row in f32:
            w("         %s," % c_list(row, 9))
        w("     },")
        w("     %d," % len(state))
        w("     {")
        for row in state:
            w("         %s," % c_list(row, 9))
        if not state:
            w("         {0},")
        w("     }},")
    w("};")
    w("")
    w("// torch.nn.utils.clip_grad_norm_(params, max_norm) on these gradients: the")
    w("// returned total norm and the gradients afterwards.")
    w("#define OPTREF_CLIPS %d" % len(CLIP_MAX_NORMS))
    w("static const double optref_clip_grads[OPTREF_NUMEL] =")
    w("    %s;" % c_list(flat(clip_grads), 4))
    w("typedef struct optref_clip {")
    w("    double max_norm;")
    w("    double total_f64, total_f32;")
    w("    double grads_f64[OPTREF_NUMEL], grads_f32[OPTREF_NUMEL];")
    w("} optref_clip;")
    w("static const optref_clip optref_clips[OPTREF_CLIPS] = {")
    for max_norm in CLIP_MAX_NORMS:
        t64, g64 = run_clip(clip_grads, max_norm, torch.float64)
        t32, g32 = run_clip(clip_grads, max_norm, torch.float32)
        w("    {%s, %s, %s," % (c(max_norm), c(t64), c(t32)))
        w("     %s," % c_list(g64, 5))
        w("     %s}," % c_list(g32, 5))
    w("};")
    w("")
    w("#endif")

    root = os.path.dirname(HERE)
    path = os.path.join(root, "reference", "optim_reference.h")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")
    print("wrote", path, file=sys.stderr)
    for name, cls_name, lrs, kwargs in CASES:
        if name in BEFORE_FIRST_STEP:
            path = os.path.join(root, "reference", "optim_%s_step0.safetensors" % name)
            save_before_first_step(cls_name, lrs, kwargs, init, path)
            print("wrote", path, file=sys.stderr)


if __name__ == "__main__":
    main()
