"""Getting started with monarch-core.

Run:  python examples/getting_started.py

Spawns 4 worker processes on this machine, puts an actor on each, and shows
the adverbs (call, call_one, choose, stream, broadcast), ValueMesh slicing, a
remote error caught as ActorError, and a port (Channel) filled by the actors.
"""

from __future__ import annotations

import asyncio
import os

from monarch_core.actor import (
    Actor,
    ActorError,
    Channel,
    Port,
    current_rank,
    endpoint,
    this_host,
)


class Trainer(Actor):
    """A toy trainer: keeps a step counter and a learning rate."""

    def __init__(self, lr: float) -> None:
        self.lr = lr
        self.step = 0

    @endpoint
    def train(self, steps: int) -> dict:
        self.step += steps
        return {"rank": current_rank().rank, "step": self.step, "pid": os.getpid()}

    @endpoint
    async def loss(self) -> float:
        await asyncio.sleep(0.01 * (3 - current_rank()["gpus"]))  # ordinary asyncio works here
        return round(1.0 / (1 + self.step) + current_rank().rank * 0.001, 4)

    @endpoint
    def set_lr(self, lr: float) -> None:
        self.lr = lr

    @endpoint
    def get_lr(self) -> float:
        return self.lr

    @endpoint
    def check(self, x: int) -> int:
        if x < 0:
            raise ValueError(f"x must be non-negative, got {x}")
        return x * 2

    @endpoint
    def report_to(self, port: Port[str]) -> None:
        port.send(f"rank {current_rank().rank} at step {self.step}")


def main() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 4})
    trainers = procs.spawn("trainers", Trainer, lr=0.1)

    # call: every actor, results as a ValueMesh
    results = trainers.train.call(10).get()
    print("call ->", [r["step"] for r in results.values()], "from", len({r["pid"] for r in results.values()}), "processes")

    # slicing a mesh, and call_one on a single actor
    print("call_one on gpus=2 ->", trainers.slice(gpus=2).train.call_one(5).get()["step"])

    # ValueMesh slicing and lookup
    losses = trainers.loss.call().get()
    print("ValueMesh extent:", losses.extent)
    print("loss at gpus=1:", losses.item(gpus=1), "| gpus 2..3:", losses.slice(gpus=slice(2, 4)).values())

    # choose: one actor, load-balanced
    print("choose ->", trainers.get_lr.choose().get())

    # stream: replies in arrival order
    print("stream ->", [f.get() for f in trainers.loss.stream()])

    # broadcast: fire-and-forget; later calls from this client see its effect (FIFO per sender)
    trainers.set_lr.broadcast(0.01)
    print("after broadcast ->", trainers.get_lr.call().get().values())

    # a remote exception arrives as ActorError; the actor keeps serving
    try:
        trainers.slice(gpus=0).check.call_one(-1).get()
    except ActorError as e:
        print("caught ActorError:", type(e.exception).__name__, "-", e.exception)
    print("still serving ->", trainers.slice(gpus=0).check.call_one(21).get())

    # a port: actors send to a channel the client reads
    port, receiver = Channel[str].open()
    trainers.report_to.broadcast(port)
    print("port ->", sorted(receiver.recv().get() for _ in range(4)))

    procs.stop().get()
    print("done")


if __name__ == "__main__":
    main()
