"""``ebplus sim theory`` and ``ebplus sim estimate``: the closed forms and the estimator from the shell."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ebplus.controller import theory
from ebplus.controller.estimator import WorkloadEstimator
from ebplus.controller.messages import CompletionRecord, FinishReason

# theta0 needs alpha_p/alpha_d; without flags `estimate` uses the H200 reference
# calibration (Qwen3-8B, DESIGN §4).
DEFAULT_ALPHA_P = 1.2786e-3
DEFAULT_ALPHA_D = 8.921e-3

THEORY_KEYS = (
    "theta0",
    "delta_theta",
    "theta_star",
    "k_star",
    "n_star_paper",
    "n_star_clt",
    "tp_eb",
    "tp_mb",
    "winner",
)


def _beta_mb(text: str) -> tuple[float, float, float]:
    parts = text.split(",")
    if len(parts) != 3:
        raise argparse.ArgumentTypeError(f"--beta-mb needs three numbers a,b,c, got {text!r}")
    try:
        return tuple(float(p) for p in parts)  # type: ignore[return-value]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--beta-mb needs three numbers a,b,c, got {text!r}") from None


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "theory",
        help="evaluate the closed forms (theta0, k*, N*, TP_EB, TP_MB, crossover)",
        description=(
            "Evaluate the EB+ closed forms for one workload and cost model: the CFR threshold "
            "theta0 (eq. 3), the IFR correction (eq. 5), k* = floor(theta* N), the memory-safe "
            "N* (eq. 6 and the CLT form), EB and MB throughput (requests/s) and the crossover."
        ),
    )
    req = p.add_argument_group("workload and cost model (required)")
    req.add_argument("--p0", type=float, required=True, help="hazard at t=0, 1/mean output for geometric outputs")
    req.add_argument("--eta", type=float, required=True, help="hazard slope (0 for geometric outputs)")
    req.add_argument("--alpha-p", type=float, required=True, help="prefill step fixed cost (s)")
    req.add_argument("--alpha-d", type=float, required=True, help="decode step fixed cost (s)")
    req.add_argument("--beta-p", type=float, required=True, help="prefill cost per token (s)")
    req.add_argument("--beta-d", type=float, required=True, help="decode cost per sequence (s)")
    req.add_argument("--mu-l", type=float, required=True, help="mean input length (tokens)")
    req.add_argument("--n", type=int, required=True, help="decode slots N (concurrent requests)")
    req.add_argument("--kv-capacity", type=float, required=True, help="KV cache capacity (tokens)")
    req.add_argument("--eps", type=float, required=True, help="allowed KV overflow probability")
    p.add_argument("--max-num-seqs", type=int, default=None, help="upper clamp for N* (default: --n)")
    p.add_argument(
        "--beta-mb",
        type=_beta_mb,
        default=None,
        metavar="A,B,C",
        help="mixed-step cost a+b*r+c*r^2 (default: no interference, beta_p*(1-r)+beta_d*r)",
    )
    p.add_argument("--alpha-mb", type=float, default=None, help="mixed step fixed cost (default: alpha-p)")
    p.add_argument("--mu-o", type=float, default=None, help="mean output length for throughputs (default: 1/p0)")
    p.add_argument(
        "--budget", type=float, default=None, help="tokens per step (max_num_batched_tokens; default: unbounded)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run_theory)

    e = sub.add_parser(
        "estimate",
        help="estimate p0, eta, mu_O, mu_L from a file of lengths",
        description=(
            "Fit the output-length hazard h(t) = p0 + eta*t to a file of lengths, exactly as the "
            "online controller does. FILE holds one output length per line, or JSON lines with "
            "'output_len' and optional 'input_len' and 'censored' (true when max_tokens stopped it)."
        ),
    )
    e.add_argument("--lengths", type=Path, required=True, metavar="FILE", help="lengths file")
    e.add_argument(
        "--alpha-p", type=float, default=DEFAULT_ALPHA_P, help="prefill fixed cost for theta0 (default: H200 reference)"
    )
    e.add_argument(
        "--alpha-d", type=float, default=DEFAULT_ALPHA_D, help="decode fixed cost for theta0 (default: H200 reference)"
    )
    e.add_argument("--json", action="store_true", help="print one JSON object")
    e.set_defaults(run=run_estimate)


def evaluate(args: argparse.Namespace) -> dict:
    """All closed forms for the CLI's arguments, as a flat dict of ``THEORY_KEYS``."""
    n = args.n
    max_num_seqs = args.max_num_seqs or n
    ts = theory.theta_star(args.p0, args.eta, args.alpha_p, args.alpha_d, args.beta_d, n)
    k = theory.k_star(ts.theta_star, n)
    if k >= n:
        raise ValueError(f"n must be large enough that k* < n; got n={n}, k*={k}")
    mu_o = args.mu_o if args.mu_o is not None else 1.0 / args.p0
    coeffs = args.beta_mb or (args.beta_p, args.beta_d - args.beta_p, 0.0)
    n_args = (args.kv_capacity, args.eps, args.p0, args.mu_l, ts.theta0, max_num_seqs)
    xo = theory.crossover(
        k, n, args.alpha_p, args.alpha_d, args.beta_p, args.beta_d, coeffs, args.mu_l, mu_o, args.alpha_mb, args.budget
    )
    return {
        "theta0": ts.theta0,
        "delta_theta": ts.delta_theta,
        "theta_star": ts.theta_star,
        "k_star": k,
        "n_star_paper": theory.n_star_paper(*n_args),
        "n_star_clt": theory.n_star_clt(*n_args),
        "tp_eb": xo.tp_eb,
        "tp_mb": xo.tp_mb,
        "winner": xo.winner.value,
        "_crossover": xo,
    }


def run_theory(args: argparse.Namespace) -> int:
    result = evaluate(args)
    xo: theory.Crossover = result.pop("_crossover")
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"theta0        {result['theta0']:.6f}   (CFR threshold, eq. 3)")
    print(f"delta_theta   {result['delta_theta']:.6f}   (IFR correction, eq. 5, clamped)")
    print(f"theta*        {result['theta_star']:.6f}")
    print(f"k*            {result['k_star']}   of N = {args.n}")
    print(f"N* (paper)    {result['n_star_paper']}")
    print(f"N* (CLT)      {result['n_star_clt']}")
    print(f"TP_EB         {result['tp_eb']:.4f} req/s")
    print(f"TP_MB         {result['tp_mb']:.4f} req/s")
    print(
        f"winner        {result['winner']}   (EB {xo.t_eb:.4g} vs MB {xo.t_mb:.4g} s/token; margin {xo.margin:.4g}; "
        f"{xo.mb_mixed_share:.0%} of MB's steps carry prompt tokens)"
    )
    return 0


def read_lengths(path: Path) -> list[CompletionRecord]:
    """Parse a lengths file into finished requests; errors name the file, line and field.

    A line is an output length, or a JSON object with ``output_len`` and optionally
    ``input_len``, ``max_tokens`` (the request's cap) and ``finish`` (``stop``,
    ``length``, ``abort``; ``"censored": true`` is read as ``length``, the old form).
    """
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read: {exc.strerror}") from None
    records: list[CompletionRecord] = []

    def as_length(value: object, where: str, lo: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int | float) or not float(value).is_integer():
            raise ValueError(f"{where}: must be an integer, got {value!r}")
        if value < lo:
            raise ValueError(f"{where}: must be >= {lo}, got {value!r}")
        return int(value)

    for lineno, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{path}:{lineno}"
        if line.startswith("{"):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}: invalid JSON: {exc.msg}") from None
            if "output_len" not in rec:
                raise ValueError(f"{where}: field 'output_len' is missing")
            out = as_length(rec["output_len"], f"{where}: field 'output_len'", 1)
            flag = rec.get("censored", False)
            if not isinstance(flag, bool):
                raise ValueError(f"{where}: field 'censored' must be true or false, got {flag!r}")
            try:
                finish = FinishReason(rec.get("finish", "length" if flag else "stop"))
            except ValueError:
                raise ValueError(
                    f"{where}: field 'finish' must be stop, length or abort, got {rec['finish']!r}"
                ) from None
            cap = as_length(
                rec.get("max_tokens", out if finish is FinishReason.LENGTH else 0), f"{where}: field 'max_tokens'", 0
            )
            inp = as_length(rec.get("input_len", 1), f"{where}: field 'input_len'", 1)
            records.append(CompletionRecord(inp, out, finish, seq=len(records), max_tokens=cap))
        else:
            try:
                value = int(line)
            except ValueError:
                raise ValueError(f"{where}: expected an integer output length, got {line[:40]!r}") from None
            out = as_length(value, f"{where}: output length", 1)
            records.append(CompletionRecord(1, out, FinishReason.STOP, seq=len(records)))
    if not records:
        raise ValueError(f"{path}: no lengths found")
    return records


def run_estimate(args: argparse.Namespace) -> int:
    records = read_lengths(args.lengths)
    has_inputs = any(r.input_len != 1 for r in records)
    est = WorkloadEstimator(window=len(records), update_every=1, min_samples=1)
    for rec in records:
        est.observe(rec)
    e = est.update()
    assert e is not None
    result = {
        "p0": e.p0,
        "eta": e.eta,
        "mu_o": e.mu_o,
        "mu_l": e.mu_l if has_inputs else None,
        "theta0": theory.theta0(e.p0, args.alpha_p, args.alpha_d),
        "n_samples": e.n_samples,
        "model": e.model,
        "gof": e.gof,
        "method": e.method,
    }
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"samples   {e.n_samples} ({e.n_censored} censored)")
    print(f"p0        {e.p0:.6g}   per token")
    print(f"eta       {e.eta:.6g}   per token^2")
    print(f"mu_O      {e.mu_o:.2f}   tokens")
    print(f"mu_L      {e.mu_l:.2f}   tokens" if has_inputs else "mu_L      n/a (no input lengths in file)")
    print(f"theta0    {result['theta0']:.6f}   (alpha_p = {args.alpha_p:g} s, alpha_d = {args.alpha_d:g} s)")
    print(
        f"model     {e.model} (natural hazard p0 = {e.natural_p0:.4g}, eta = {e.natural_eta:.3g} after "
        f"t0 = {e.t0}); goodness of fit {e.gof:.3f} (KS distance to Kaplan-Meier)"
    )
    print(f"theta     {e.method}")
    return 0
