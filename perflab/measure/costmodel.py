"""Book 13.7's cost model of gradient synchronization: parameter server vs ring allreduce.

Every transfer of ``nbytes`` over a link of ``bandwidth`` bytes/s costs ``latency + nbytes /
bandwidth``. With n workers holding S bytes of gradients each:

- aggregate on one device, then broadcast: the other n-1 send S to it and get S back,
  one after the other over its link: 2 (n-1) transfers of S;
- through the CPU: all n send S up and receive S back over the one link to the host: 2n of S;
- split n ways: each device aggregates 1/n of the gradients; over a full-bandwidth switch
  every device sends and receives n-1 pieces of S/n at once: 2 (n-1) transfers of S/n;
- ring: 2 (n-1) steps of S/n over ``links`` rings at once; the book rounds it to 2 S / B.
"""

from __future__ import annotations

from dataclasses import dataclass

BOOK_GRADIENTS = 160e6  # bytes
BOOK_PCIE = 16e9  # bytes/s
BOOK_NVLINK = 18e9  # bytes/s per link (V100)


def transfer_s(nbytes: float, bandwidth: float, latency: float = 0.0) -> float:
    return latency + nbytes / bandwidth


def aggregate_on_one_device_s(nbytes: float, n: int, bandwidth: float, latency: float = 0.0) -> float:
    return 2 * (n - 1) * transfer_s(nbytes, bandwidth, latency)


def through_cpu_s(nbytes: float, n: int, bandwidth: float, latency: float = 0.0) -> float:
    return 2 * n * transfer_s(nbytes, bandwidth, latency)


def split_n_ways_s(nbytes: float, n: int, bandwidth: float, latency: float = 0.0) -> float:
    return 2 * (n - 1) * transfer_s(nbytes / n, bandwidth, latency)


def ring_s(nbytes: float, n: int, bandwidth: float, links: int = 1, latency: float = 0.0) -> float:
    """Ring allreduce: reduce-scatter then all-gather, 2 (n-1) steps of S/n on each ring."""
    return 2 * (n - 1) * transfer_s(nbytes / n, bandwidth * links, latency)


def ring_book_s(nbytes: float, bandwidth: float, links: int = 1) -> float:
    """The book's round figure, 2 S / (links * B): the large-n limit of ``ring_s``."""
    return 2 * nbytes / (bandwidth * links)


def bus_bandwidth(nbytes: float, seconds: float, n: int) -> float:
    """nccl-tests' bus bandwidth for allreduce: algorithm bandwidth x 2 (n-1) / n."""
    return nbytes / seconds * 2 * (n - 1) / n if n > 1 else nbytes / seconds


@dataclass(frozen=True)
class BookCase:
    name: str
    model_s: float
    book_s: float


def book_cases() -> list[BookCase]:
    """The worked example of book 13.7, recomputed by the model beside the book's figures."""
    s, pcie, nvlink = BOOK_GRADIENTS, BOOK_PCIE, BOOK_NVLINK
    return [
        BookCase("one transfer of 160 MB over PCIe", transfer_s(s, pcie), 0.010),
        BookCase("4 GPUs: aggregate on one GPU, then broadcast", aggregate_on_one_device_s(s, 4, pcie), 0.060),
        BookCase("4 GPUs: aggregate through the CPU", through_cpu_s(s, 4, pcie), 0.080),
        BookCase("4 GPUs: split four ways", split_n_ways_s(s, 4, pcie), 0.015),
        BookCase("8 V100s: ring over 3 NVLink rings (book's 2S/B)", ring_book_s(s, nvlink, links=3), 0.006),
        BookCase("8 V100s: ring over 3 NVLink rings (exact 2(n-1)/n)", ring_s(s, 8, nvlink, links=3), 0.006),
    ]
