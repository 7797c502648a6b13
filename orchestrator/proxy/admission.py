"""A job's proxy budgets, counted when a request is admitted, not when it finishes: a harness
that sends many requests at once gets no more than one that sends them in turn.

    slots = CallSlots(max_calls)            # the recorder's: model calls
    slot = slots.take()                     # None: every call is answered or in flight already
    slot.spend()                            # the call is sent to the backend: it counts for good
    slot.close()                            # gives it back unless spent (refused, failed before)

    intake = BodyAllowance(max_body_bytes)  # the server's: bytes of request bodies held at once
    async with intake.hold(content_length): # waits for room, then reads and parses the body
        ...

The rules: a call counts once it is sent to the backend (the backend then samples it, whether or
not the harness stays for the answer); a call refused or failed before that gives its slot back.
A body holds its bytes from before it is read until it is parsed (what is kept of it afterwards
is bounded by the calls and by `chat_form.MessageForms`); a body of unknown length (chunked)
holds the whole allowance. Tokens need no reservation: every token limit (max_tokens_per_call,
max_context_tokens) is a bound on one call, computed from that call's own prompt.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class CallSlots:
    """`limit` model calls: taken at admission, each spent once its call reaches the backend."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.taken = 0          # spent + in flight

    def take(self) -> "CallSlot | None":
        if self.taken >= self.limit:
            return None
        self.taken += 1
        return CallSlot(self)


class CallSlot:
    __slots__ = ("_slots", "_spent", "_closed")

    def __init__(self, slots: CallSlots) -> None:
        self._slots, self._spent, self._closed = slots, False, False

    def spend(self) -> None:
        self._spent = True

    def close(self) -> None:
        if not self._spent and not self._closed:
            self._slots.taken -= 1
        self._closed = True


class BodyAllowance:
    """At most `allowance` bytes of request bodies held at once; a request waits (its body unread,
    in the socket's buffers) for room, first come first served."""

    def __init__(self, allowance: int) -> None:
        self.allowance = allowance
        self.held = 0
        self._waiting: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    @asynccontextmanager
    async def hold(self, size: int | None) -> AsyncIterator[None]:
        wanted = self.allowance if size is None else min(size, self.allowance)
        if self._waiting or self.held + wanted > self.allowance:
            waiter = asyncio.get_running_loop().create_future()
            self._waiting.append((wanted, waiter))
            try:
                await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._release(wanted)      # granted as it was cancelled: pass it on
                else:
                    if (wanted, waiter) in self._waiting:
                        self._waiting.remove((wanted, waiter))
                    self._grant()              # it may have been the head others waited behind
                raise
        else:
            self.held += wanted
        try:
            yield
        finally:
            self._release(wanted)

    def _release(self, size: int) -> None:
        self.held -= size
        self._grant()

    def _grant(self) -> None:
        while self._waiting and self.held + self._waiting[0][0] <= self.allowance:
            wanted, waiter = self._waiting.popleft()
            if not waiter.done():
                self.held += wanted
                waiter.set_result(None)
