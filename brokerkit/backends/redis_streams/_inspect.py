"""browse and stats: read-only scripts over a queue's (or DLQ's) stream pair.

Nothing here writes: no ``XREADGROUP``, no ``XCLAIM``, no consumer created. Each script
reads one stream atomically; the plain stream and its fifo twin are read one after the
other and merged by entry id.

What "still in the queue" means (the memory backend's rule): an entry is shown and
counted while some consumer group still needs it (not yet delivered to it, or in its
PEL: leased, nacked, parked behind its fifo head), or, when the stream has no consumer
group yet, while it is retained at all (a group created later starts at the oldest
entry). Entries every group has acked but that no ``XTRIM`` removed yet are skipped.
"""

from __future__ import annotations

from typing import Any

from brokerkit.backends import Delivery, QueueStats
from brokerkit.backends.redis_streams._keys import FIFO_ID_PREFIX, Keys, Script, decode_entry
from brokerkit.backends.redis_streams._link import RedisLink
from brokerkit.backends.redis_streams._receiver import PARK

__all__ = ["browse_pair", "stats_pair"]

_IDS = """
local function parse(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(seq)
end
local function after(a, b)  -- entry id a > entry id b
  local am, as = parse(a)
  local bm, bs = parse(b)
  return am > bm or (am == bm and as > bs)
end
local function groups_of(stream)
  local out = {}
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
    local r = {}
    for i = 1, #g, 2 do r[g[i]] = g[i + 1] end
    out[#out + 1] = r
  end
  return out
end
"""

BROWSE = (
    _IDS
    + """
-- KEYS: stream.  ARGV: limit.  Up to limit entries some group still needs (every retained
-- entry when the stream has no group), oldest first, as a flat {id, fields}* list.
local stream, limit = KEYS[1], tonumber(ARGV[1])
if limit <= 0 or redis.call('EXISTS', stream) == 0 then return {} end
local groups = groups_of(stream)
-- below the oldest pending entry and the cursor of every group, every group is done
local start, exclusive = nil, false
for _, g in ipairs(groups) do
  local first = redis.call('XPENDING', stream, g['name'], '-', '+', 1)[1]
  local id, excl = g['last-delivered-id'], true
  if first and not after(first[1], id) then id, excl = first[1], false end
  if start == nil or after(start, id) or (start == id and not excl) then
    start, exclusive = id, excl
  end
end
local from = '-'
if start then from = (exclusive and '(' or '') .. start end
local out, n = {}, 0
local want = math.max(limit, 64)
while n < limit do
  local batch = redis.call('XRANGE', stream, from, '+', 'COUNT', want)
  if #batch == 0 then break end
  local first, last = batch[1][1], batch[#batch][1]
  local pending = {}
  for gi, g in ipairs(groups) do
    local set, lo = {}, first
    while true do
      local p = redis.call('XPENDING', stream, g['name'], lo, last, 1000)
      for _, e in ipairs(p) do set[e[1]] = true end
      if #p < 1000 then break end
      lo = '(' .. p[#p][1]
    end
    pending[gi] = set
  end
  for _, e in ipairs(batch) do
    local keep = #groups == 0
    for gi, g in ipairs(groups) do
      if keep then break end
      keep = pending[gi][e[1]] or after(e[1], g['last-delivered-id'])
    end
    if keep then
      out[#out + 1], out[#out + 2] = e[1], e[2]
      n = n + 1
      if n >= limit then break end
    end
  end
  if #batch < want then break end
  from = '(' .. last
end
return out
"""
)

STATS = (
    _IDS
    + """
-- KEYS: stream, due ZSET of the group ('' for none).  ARGV: group ('' for none), park.
-- Returns {now_ms, ready, in_flight, delayed}; in_flight and delayed are -1 for no group
-- (ready is then every entry some group still needs, or every entry without groups).
local stream, due, group, park = KEYS[1], KEYS[2], ARGV[1], ARGV[2]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if redis.call('EXISTS', stream) == 0 then return {now, 0, 0, 0} end
local groups = groups_of(stream)
local function undelivered(g)  -- entries after the group's cursor
  if g['lag'] then return tonumber(g['lag']) end
  local count, from = 0, '(' .. g['last-delivered-id']
  while true do
    local batch = redis.call('XRANGE', stream, from, '+', 'COUNT', 1000)
    count = count + #batch
    if #batch < 1000 then return count end
    from = '(' .. batch[#batch][1]
  end
end
if group == '' then
  if #groups == 0 then return {now, redis.call('XLEN', stream), -1, -1} end
  local low = groups[1]
  for _, g in ipairs(groups) do
    if after(low['last-delivered-id'], g['last-delivered-id']) then low = g end
  end
  local count, seen, floor = undelivered(low), {}, low['last-delivered-id']
  for _, g in ipairs(groups) do
    local lo = '-'
    while true do
      local p = redis.call('XPENDING', stream, g['name'], lo, floor, 1000)
      for _, e in ipairs(p) do
        if not seen[e[1]] then seen[e[1]] = true count = count + 1 end
      end
      if #p < 1000 then break end
      lo = '(' .. p[#p][1]
    end
  end
  return {now, count, -1, -1}
end
local mine = nil
for _, g in ipairs(groups) do
  if g['name'] == group then mine = g end
end
if mine == nil then return {now, redis.call('XLEN', stream), 0, 0} end
local ready, live, parked = undelivered(mine), 0, 0
for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', stream, group)) do
  local r = {}
  for i = 1, #c, 2 do r[c[i]] = c[i + 1] end
  local name, pending = r['name'], r['pending']
  if name == park then
    parked = pending
  elseif pending > 0 then
    local lease = tonumber(string.match(name, '/L(%d+)$'))
    local expired = 0
    if lease then
      expired = #redis.call('XPENDING', stream, group, 'IDLE', lease, '-', '+', pending, name)
    end
    ready = ready + expired
    live = live + pending - expired
  end
end
local later = redis.call('ZCOUNT', due, '(' .. now, '+inf')
-- park owns the due entries and the fifo entries waiting behind their group's head
return {now, ready + parked - later, live, later}
"""
)

_BROWSE = Script.of(BROWSE)
_STATS = Script.of(STATS)


def _order(entry_id: bytes, twin: int) -> tuple[int, int, int]:
    ms, _, seq = entry_id.partition(b"-")
    return int(ms), int(seq), twin


async def _entries(link: RedisLink, stream: str, limit: int) -> list[tuple[bytes, Any]]:
    flat = await link.script(_BROWSE, (stream,), (limit,))
    return [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]


async def browse_pair(link: RedisLink, stream: str, limit: int) -> list[Delivery[None]]:
    """The oldest ``limit`` entries of the plain stream and its fifo twin still needed,
    merged by entry id (ties, the same millisecond in both streams: plain first)."""
    found: list[tuple[tuple[int, int, int], bytes, Any]] = []
    for twin, name in enumerate((stream, Keys.fifo(stream))):
        found += [(_order(i, twin), i, f) for i, f in await _entries(link, name, limit)]
    found.sort(key=lambda item: item[0])
    out: list[Delivery[None]] = []
    for order, entry_id, fields in found[:limit]:
        d = decode_entry(entry_id, fields, 0, fifo=order[2] == 1)
        out.append(
            Delivery(d.id, d.body, d.headers, d.fifo_group, d.dedup_id, 0, None, defect=d.defect)
        )
    return out


async def stats_pair(link: RedisLink, stream: str, group: str | None) -> QueueStats:
    """One STATS script per stream of the pair, summed; the oldest entry's age from its id
    (the server's clock when it was added) and the server's clock now."""
    ready = in_flight = delayed = 0
    now_ms = 0
    for name in (stream, Keys.fifo(stream)):
        due = Keys.group(name, group)[0] if group is not None else ""
        reply = await link.script(_STATS, (name, due), (group or "", PARK))
        now_ms, r, i, d = (int(x) for x in reply)
        ready, in_flight, delayed = ready + r, in_flight + i, delayed + d
    oldest = await browse_pair(link, stream, 1)
    age = None
    if oldest:
        ms = int(oldest[0].id.removeprefix(FIFO_ID_PREFIX).partition("-")[0])
        age = max(0.0, (now_ms - ms) / 1000)
    if group is None:
        return QueueStats(ready=ready, oldest_age=age)
    return QueueStats(ready, in_flight, delayed, None, age)
