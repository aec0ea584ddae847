"""13.5 and 13.6, training on multiple GPUs: the book's setups beside the train experiment's
presets, its claims, its size in the chapter.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from perflab.book import REFERENCE, SETUP_ONLY
from perflab.config.contract import Figure, Samples, Section, Setup, Table

if TYPE_CHECKING:
    from pandas import DataFrame

    from perflab.analysis.claims import Claim, Tree
    from perflab.measure.sizing import Calibration, Point


# The book's sections of its training presets (rows' experiment column), and their setups:
# (what, the book's, the summary row's column that holds ours).
LENET = [
    ("model", "LeNet, data parallelism from scratch", "model"),
    ("devices", "1 GPU, then 2 GPUs", "n_devices"),
    ("global batch", "256 on 1 and on 2 GPUs", "global_batch"),
    ("learning rate", "0.2", "lr"),
    ("epochs", "10", "epochs"),
]
BOOK = {
    "lenet_scratch": ("13.5", "Training on multiple GPUs", "", LENET),
    "train": (
        "13.5",
        "Training on multiple GPUs",
        "This preset is the generic trainer: compare the settings before the figures.",
        LENET,
    ),
    "resnet18_concise": (
        "13.6",
        "Concise multi-GPU",
        "",
        [
            ("model", "ResNet-18 (the book's small-input variant), nn.DataParallel", "model"),
            ("devices", "1 GPU, then 2 GPUs", "n_devices"),
            ("global batch", "256 on 1 GPU, 512 on 2", "global_batch"),
            ("learning rate", "0.1 on 1 GPU, 0.2 on 2", "lr"),
            ("epochs", "10", "epochs"),
        ],
    ),
}


def work(rows: Sequence[Mapping[str, Any]]) -> str:
    """How much work the run timed, beside the book's run of that preset."""
    from perflab.store.rows import number

    r = next((x for x in rows if number(x.get("global_batch")) is not None), rows[0] if rows else {})
    epochs, size = number(r.get("cfg.trainer.epochs")), number(r.get("cfg.data.train_size"))
    batch, n = number(r.get("global_batch")), number(r.get("n_devices"))
    if epochs is None or batch is None:
        return ""
    setup = {what: theirs for what, theirs, _ in BOOK.get(str(r.get("experiment")), ("", "", "", []))[3]}
    book = f"{setup['epochs']} epochs at global batch {setup['global batch']}" if "epochs" in setup else ""
    what = f"{size:.0f}" if size is not None else "all the"
    unit = r.get("batch_unit") or r.get("items_unit") or "items"  # what data.train_size counts: images, sequences
    line = (
        f"work: {epochs:.0f} epoch{'s' if epochs != 1 else ''} of {what} {unit} at global batch {batch:.0f} "
        f"on {n or 1:.0f} device{'s' if (n or 1) > 1 else ''}"
    )
    return line + (f"; the book: {book}" if book else "")


def report(rows: DataFrame, samples: Samples) -> Section:
    """13.5 / 13.6 (by preset): the book's setup beside ours; the runs compared point by point,
    with their scaling and batch-size plots."""
    from perflab.analysis import plots
    from perflab.analysis.frames import per_run, text

    names = rows["experiment"].dropna().unique() if "experiment" in rows else []
    number_, title, words, setup = BOOK.get(text(names[0]) if len(names) else "", ("", "Training", "", []))

    def ours(column: str) -> Callable[[Sequence[Mapping[str, Any]]], str]:
        """A run's value: its summary row's; a run stopped before its summary, its newest row's
        that has one (every epoch row carries the model, devices, global batch and lr)."""

        def value(r: Sequence[Mapping[str, Any]]) -> str:
            summary = [x for x in r if x.get("measurement") == "train"]
            found = summary or [x for x in r if text(x.get(column))]
            return text(found[-1].get(column)) if found else ""

        return value

    table, notes = compared(rows, samples)
    figures = [
        Figure(
            "scaling",
            plots.scaling,
            table,
            caption="Dashed: ideal linear scaling. Error bars (3 or more timed epochs): interquartile range "
            "of the epoch rates.",
            why_none="scaling: needs runs over devices.count (a sweep: devices.count=1,2)",
        ),
        Figure(
            "batch_size",
            plots.batch_size,
            table,
            why_none="speed and accuracy vs batch size: needs runs over trainer.batch_size",
        ),
    ]
    return Section(
        number=number_,
        title=title,
        headline=fastest(table) if table is not None and len(table) > 1 else (),
        reference=REFERENCE,
        notes=[x for x in (words, SETUP_ONLY if setup else "") if x],
        setup=[Setup(what, theirs, per_run(rows, ours(column))) for what, theirs, column in setup],
        tables=[points(table, notes)] if (table is not None and len(table) > 1) or notes else [],
        figures=figures if table is not None else [],
    )


def compared(rows: DataFrame, samples: Samples) -> tuple[DataFrame | None, list[str]]:
    """compare()'s table of the runs (S(n), E(n) when the device count varies), each point with
    its raw values for error bars, and what compare says about it."""
    from perflab import compare
    from perflab.analysis.frames import ok

    found = ok(rows)
    if found.empty:
        return None, []
    try:
        table = compare.compare(rows=found, samples=dict(samples))
    except compare.CompareError as err:
        return None, [str(err)]
    notes = list(table.attrs.get("notes", []))
    return (None if table.empty else table), notes


def _point(e: Mapping[str, Any], count: str | None) -> str:
    from perflab.analysis.frames import label

    return label([c for c in e if str(c).startswith("cfg.") and c != count], e) or str(e.get("measurement", ""))


def points(table: DataFrame | None, notes: Sequence[str]) -> Table:
    """The compared points: throughput, per device, S(n), E(n), test accuracy; throughput's
    unit in the header, or in each cell where the points count different items."""
    from perflab.analysis.frames import text, unit
    from perflab.store.rows import number

    intro = "Compared point by point (perflab compare)" + (": " + " ".join(notes) if notes else ".")
    if table is None:
        return Table([], [], intro)
    count = next((c for c in ("cfg.devices.count", "n_devices") if c in table), None)
    metric = str(table["metric"].iloc[0])
    shared = unit(table, default="")  # "" where points count different items: each cell says its unit
    each = metric == "items_per_s" and not shared
    rate = "throughput" if each else f"{shared}/s" if metric == "items_per_s" else metric
    body = []
    for e in table.to_dict("records"):

        def fmt(column: str, pattern: str = "{:.4g}", e: Mapping[str, Any] = e) -> str:
            x = number(e.get(column))
            return pattern.format(x) if x is not None else ""

        body.append(
            [
                _point(e, count),
                text(e.get(count)) if count else "",
                fmt(metric) + (f" {text(e.get('items_unit')) or 'items'}/s" if each else ""),
                fmt("per_device_items_per_s"),
                fmt("speedup", "{:.2f}x"),
                fmt("efficiency", "{:.0%}"),
                fmt("test_acc", "{:.3f}"),
                text(e.get("runs")),
                text(e.get("suspect")),
            ]
        )
    header = ["point", "devices", rate, "per device", "S(n)", "E(n)", "test acc", "runs", "suspect"]
    return Table(header, body, intro)


def fastest(table: DataFrame) -> list[str]:
    """A sweep's headline: its fastest point, and how far the device count scaled."""
    from perflab.analysis.frames import text
    from perflab.analysis.table import per_s
    from perflab.store.rows import number

    metric = str(table["metric"].iloc[0])
    count = next((c for c in ("cfg.devices.count", "n_devices") if c in table), None)
    rows = table.dropna(subset=[metric]).to_dict("records")
    if not rows:
        return []
    top = max(rows, key=lambda e: float(e[metric]))
    unit = f"{text(top.get('items_unit')) or 'items'}/s" if metric == "items_per_s" else metric
    where = ", ".join(x for x in (_point(top, count), f"{number(top.get(count)) or 0:g} devices" if count else "") if x)
    acc = number(top.get("test_acc"))
    best = per_s(float(top[metric]), unit) if metric == "items_per_s" else f"{float(top[metric]):.4g} {unit}"
    lines = [f"fastest: {where}: {best}" + (f", test acc {acc:.3f}" if acc is not None else "")]
    scaled = [e for e in rows if number(e.get("speedup")) is not None and count and (number(e.get(count)) or 0) > 1]
    if scaled:
        far = max(scaled, key=lambda e: (number(e.get(count)) or 0, float(e[metric])))
        why = text(far.get("scaling_note"))  # an efficiency above 100 %: never without its flag and cause
        lines.append(
            f"on {number(far.get(count)) or 0:g} devices ({_point(far, count)}): {float(far['speedup']):.2f}x one "
            f"device, efficiency {float(far['efficiency']):.0%}" + (f" (SUSPECT: {why})" if why else "")
        )
    return lines


# --- the chapter (perflab chapter): its size and its claims -----------------------------------

CHAPTER_SHARE = 0.5  # two sections of training: 13.5 (LeNet) and 13.6 (ResNet-18)
START_S = 4.0  # a training job before its first step: the data, the model, its FLOPs, a data-loader pass
BOOK_SPEED = {
    "13.5": "13.5: training on 2 GPUs, the batch split between them",
    "13.6": "13.6: 2 GPUs with nn.DataParallel train ResNet-18 faster than 1",
}
BOOK_SAME = "13.5: the same global batch split over k GPUs is the same SGD: the same accuracy"
BOOK_RULE = "13.6: on 2 GPUs the batch doubles (256 -> 512) and the learning rate with it (0.1 -> 0.2)"
ACCURACY_MARGIN = 0.05  # test accuracies "match" within 5 points
ON_CPU = (
    "CPU workers split one CPU's cores: k of them have no more compute than one, and the book's "
    "devices are separate GPUs"
)


def chapter(machine: Calibration, seconds: float) -> list[Point]:
    """13.5: LeNet from scratch on 1 and 2 devices (the book's batch 256, lr 0.2). 13.6:
    ResNet-18 with nn.DataParallel, 1 device at batch b / lr 0.1 and 2 at 2b / 0.2 (the linear
    rule, weak scaling), b the book's 256 where the seconds give 60 steps or more, else smaller.
    Both with PyTorch's default init: with the book's N(0, 0.01) LeNet stays at chance for its
    first hundreds of steps, more than a budget of minutes gives. Epochs, images and test
    images are sized from a timed training step (sizing.training_rate)."""
    from perflab import models
    from perflab.measure import sizing

    counts = [1, 2] if machine.count >= 2 else [1]
    lenet = sizing.training_rate(machine, "lenet", models.lenet, (1, 28, 28), 256)
    points = _training_points("13.5", "lenet_scratch", 0.4 * seconds / len(counts), lenet, 256, counts, epochs=5)
    resnet = sizing.training_rate(machine, "resnet18", models.resnet18, (1, 28, 28), 256 if machine.gpu else 32)
    run_s = 0.6 * seconds / len(counts)
    epochs = 5 if machine.gpu else 3  # a GPU has time for the 4 timed epochs the speed claim needs
    images = _images(run_s, resnet, epochs=epochs, test=eval_images("13.6", run_s, resnet, epochs))
    batch = next((b for b in (256, 128, 64) if epochs * images / b >= 60), 32)  # 60 steps or more, if it can
    points += _training_points("13.6", "resnet18_concise", run_s, resnet, batch, counts, epochs=epochs)
    return points


def eval_images(section: str, seconds: float, rate: float, epochs: int) -> int:
    """Test images: enough to tell accuracies 5 points apart (2000; 500 for ResNet-18, whose
    claim needs longer training than minutes give anyway), at most a fifth of the run's time."""
    most = 2000 if section == "13.5" else 500
    return int(min(most, max(100, 0.2 * seconds / epochs * 3 * rate)))


def _images(seconds: float, rate: float, *, epochs: int, test: int) -> float:
    """Training images per epoch that fit in ``seconds`` at ``rate`` (evaluation ~3x faster)."""
    return max(0.0, (seconds - START_S) / epochs - test / (3 * rate)) * rate


def _training_points(
    section: str,
    preset: str,
    seconds: float,
    rate: float,
    batch: int,
    counts: list[int],
    *,
    epochs: int,
) -> list[Point]:
    from perflab.measure import sizing

    test = eval_images(section, seconds, rate, epochs)
    images = sizing.round_to(_images(seconds, rate, epochs=epochs, test=test), 2 * batch, 4 * batch, 60_000)
    steps = epochs * images // batch
    common = [
        "model.init=default",
        "data=synthetic",
        f"data.train_size={images}",
        f"data.test_size={test}",
        f"trainer.epochs={epochs}",
    ]
    if section == "13.6":
        common += [f"trainer.batch_size={batch}", f"trainer.base_batch={batch}", "trainer.lr=0.1"]
    why = (
        f"{seconds:.0f} s per run: {epochs} epochs of {images} images ({steps} steps at batch {batch} on 1 device) "
        f"at the {rate:.0f} images/s a timed step gave, {test} test images; PyTorch's default init (the book's "
        "N(0, 0.01) stays at chance longer than this budget trains); synthetic data of Fashion-MNIST's shape"
    )
    if section == "13.6" and batch != 256:
        why += f"; batch {batch} / lr 0.1 instead of the book's 256 / 0.1, so that the run takes {steps} steps"
    estimate = START_S + epochs * (images / rate + test / (3 * rate)) + sizing.JOB_OVERHEAD_S
    return [
        sizing.Point(
            section,
            preset,
            [*common, f"devices.count={k}"],
            estimate * (1.25 if k > 1 and section == "13.5" else 1.0),  # scratch: the replicas take turns
            why,
            f"{k} device{'s' if k > 1 else ''}",
            section,
        )
        for k in counts
    ]


def claims(rows: DataFrame, tree: Tree) -> list[Claim]:
    """13.5 / 13.6: k devices train faster than one (GPUs; not applicable to CPU workers), at
    the accuracy of one when the global batch is the same, and the learning-rate rule keeps the
    accuracy when the batch grows with the devices (when both runs had settled)."""
    from perflab.analysis import checks
    from perflab.store.rows import number

    if "measurement" not in rows:
        return []
    summaries = rows[(rows["measurement"].astype("string") == "train") & (rows["status"].astype("string") == "ok")]
    out: list[Claim] = []
    keys = _same_setup(summaries)
    groups = [g for _, g in summaries.groupby(keys, dropna=False, sort=False)] if keys else [summaries]
    for group in groups if len(summaries) else []:
        runs = group.to_dict("records")
        ones = [r for r in runs if number(r.get("n_devices")) == 1]
        if not ones:
            continue
        base = ones[-1]
        section = BOOK.get(str(base.get("experiment")), ("13.5",))[0]  # the preset's section of the book
        others = [r for r in runs if (number(r.get("n_devices")) or 1) > 1]
        if not others:
            out.append(
                checks.not_applicable(
                    section,
                    f"k devices train {base.get('model')} faster than one, at matching accuracy",
                    BOOK_SPEED.get(section, BOOK_SPEED["13.5"]),
                    "one device only: no run on more devices in these rows",
                )
            )
        for new in others:
            out += _pair_claims(section, base, new, rows, tree)
    return out


def _same_setup(summaries: DataFrame) -> list[str]:
    """The config keys two runs must share to be compared (all but the device count and where
    results go): the keys that differ between device counts in a weak-scaling run follow from it."""
    skip = ("cfg.devices.", "cfg.results.", "cfg.bench.", "cfg.trainer.checkpoint", "cfg.trainer.resume")
    return [c for c in summaries.columns if c.startswith("cfg.") and not c.startswith(skip)]


def _pair_claims(section: str, base: dict, new: dict, rows: DataFrame, tree: Tree) -> list[Claim]:
    from perflab.analysis import checks
    from perflab.store.rows import number

    k, model = int(number(new.get("n_devices")) or 2), base.get("model")
    out: list[Claim] = []
    speed = f"{k} devices train {model} faster than 1 ({new.get('strategy')})"
    if str(new.get("devices", "")).startswith("cpu"):
        ratio = (number(new.get("items_per_s")) or 0) / (number(base.get("items_per_s")) or 1)
        out.append(
            checks.not_applicable(
                section, speed, BOOK_SPEED.get(section, BOOK_SPEED["13.5"]), ON_CPU, f"{ratio:.2f}x the images/s of 1"
            )
        )
    else:
        outcome = checks.claim(
            section,
            speed,
            BOOK_SPEED.get(section, BOOK_SPEED["13.5"]),
            "speedup > 1",
            "the 95% interval of the speedup above 1",
        )
        out.append(checks.faster(outcome, tree, base, new))
    n1, n2 = _test_size_of(base), _test_size_of(new)
    b1, b2 = number(base.get("global_batch")), number(new.get("global_batch"))
    lr1, lr2 = number(base.get("lr")), number(new.get("lr"))
    tolerance = f"the 95% interval of the difference within ±{ACCURACY_MARGIN:.2f}"
    if b1 == b2:
        outcome = checks.claim(
            section,
            f"{k} devices reach the test accuracy of 1 at the same global batch ({b1:.0f})",
            BOOK_SAME,
            "the same accuracy",
            tolerance,
        )
        out.append(
            checks.same_accuracy(
                outcome, base, new, n_base=n1, n_new=n2, classes=_classes(base), margin=ACCURACY_MARGIN
            )
        )
    elif b1 and b2 and lr1 and lr2:
        rule = str(new.get("cfg.trainer.lr_rule", "none"))
        outcome = checks.claim(
            section,
            f"Growing the batch {b1:.0f} -> {b2:.0f} with the lr by the {rule} rule ({lr1:.3g} -> {lr2:.3g}) "
            "keeps the test accuracy",
            BOOK_RULE,
            "the same accuracy",
            tolerance + "; both runs settled (test accuracy up less than half that in the last epoch)",
        )
        unsettled = "; ".join(w for w in (_still_learning(rows, base), _still_learning(rows, new)) if w)
        out.append(
            checks.same_accuracy(
                outcome,
                base,
                new,
                n_base=n1,
                n_new=n2,
                classes=_classes(base),
                margin=ACCURACY_MARGIN,
                unsettled=unsettled,
            )
        )
    return out


def _test_size_of(row: Mapping[str, Any]) -> int:
    from perflab.store.rows import number

    size = number(row.get("cfg.data.test_size"))
    if size is None:
        from perflab.train.data import TEST_SIZE

        return TEST_SIZE
    return int(size)


def _classes(row: Mapping[str, Any]) -> int:
    """What chance is 1 in: the classes the run scored (the row's, taken from the model where
    data.num_classes was null), else as configured, else the default."""
    from perflab.store.rows import number

    found = number(row.get("classes")) or number(row.get("cfg.data.num_classes"))
    if found is None:
        from perflab.train.data import CLASSES

        return int(CLASSES)
    return int(found)


def _still_learning(rows: DataFrame, summary: Mapping[str, Any]) -> str:
    """Why a run had not settled: its test accuracy still rose by half the margin or more in
    its last epoch ("" if it had settled)."""
    from perflab.store.rows import number

    epochs = rows[
        (rows["run_id"].astype("string") == str(summary.get("run_id")))
        & (rows["measurement"].astype("string") == "epoch")
    ]
    found = [number(a) for a in epochs.sort_values("epoch")["test_acc"]] if "epoch" in epochs else []
    accs = [a for a in found if a is not None]
    run = f"the {number(summary.get('n_devices')) or 1:.0f}-device run"
    if len(accs) < 2:
        return f"{run} trained one epoch: whether it settled cannot be told (trainer.epochs >= 2)"
    gain = accs[-1] - accs[-2]
    if gain >= ACCURACY_MARGIN / 2:
        return (
            f"{run} was still learning (test accuracy +{gain:.3f} in its last epoch): train longer (a larger --budget)"
        )
    return ""
