"""The Lua scripts: every step that reads then writes runs as one atomic script.

Vocabulary (see docs/backends/redis.md for the invariants in full):

* a queue is a *pair* of streams: ``S`` holds the messages without a fifo_group, read by
  the client with a plain ``XREADGROUP`` (no script: the hot path); ``F`` holds those
  with one, read inside TAKE so that routing is atomic with the read. The DLQ is a pair too;
* a *lease* is implicit: an entry in the group's PEL owned by a real consumer is leased
  until its PEL delivery time + that consumer's lease, which is part of its name
  (``.../L<ms>``). ``XCLAIM`` (a take-over, or ``JUSTID`` for extend) restarts it;
* ``due`` -- ZSET per (stream, group) of entries owned by the pseudo consumer ``park``
  that are up for delivery at their score (server ms): a nack's delay, a release, a fifo
  head made ready. Invariant: an entry is in ``due`` exactly when ``park`` owns it and it
  may be delivered at its score; a parked fifo entry (not the head) is owned by ``park``
  with delivery count 0 and is not in ``due``;
* ``fifo list`` -- LIST per (F, group, fifo_group) of the group's routed, unsettled
  entries in stream order. Only its head is ever leased or in ``due``;
* ``bell`` -- a one-entry stream per group; XADD to it wakes blocked readers when something
  became due now (nack, release, a fifo head made ready).

The lease token of a delivery is (consumer name, PEL delivery count): a settle whose
token no longer matches the PEL answers "lost" (LeaseExpired).
"""

from __future__ import annotations

_COMMON = """
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function holds(stream, group, me, id, count)
  local p = redis.call('XPENDING', stream, group, id, id, 1)
  return #p == 1 and p[1][2] == me and tonumber(p[1][4]) == tonumber(count)
end
local function ring(bell)
  redis.call('XADD', bell, 'MAXLEN', 1, '*', 'r', '1')
end
-- ack a leased entry of F; the next entry of its fifo_group (if any) becomes due now
local function settle_fifo(stream, group, due, fprefix, id, fg, now)
  redis.call('XACK', stream, group, id)
  local key = fprefix .. fg
  if redis.call('LINDEX', key, 0) == id then
    redis.call('LPOP', key)
  else
    redis.call('LREM', key, 1, id)
  end
  local nxt = redis.call('LINDEX', key, 0)
  if nxt then
    redis.call('ZADD', due, now, nxt)
    return true
  end
  return false
end
"""

TAKE = (
    _COMMON
    + """
-- KEYS: S, due of S, F, due of F, bell.
-- ARGV: group, consumer, max, fifo prefix, park consumer, sweep ('1' | '0').
-- Hands out up to max entries that need a script: expired leases (sweep), due entries
-- (nack delay over, released, fifo head ready) and new entries of F (routed by fifo_group).
-- New entries of S are not read here: the client reads them with XREADGROUP itself.
-- Returns {now, next due or false, cursor of S, cursor of F, bell id, taken, reclaimed}:
-- the cursors and the bell id only when nothing was taken (what to block on); taken = flat
-- (kind, id, fields, count)*, kind 's' or 'f', every entry now leased to the consumer;
-- reclaimed = how many of them were expired leases (as many as max: sweep again at once).
local S, DS, F, DF, bell = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local group, me, max = ARGV[1], ARGV[2], tonumber(ARGV[3])
local fprefix, park, sweep = ARGV[4], ARGV[5], ARGV[6] == '1'
local now = now_ms()
local taken, n, reclaimed = {}, 0, 0
local function hand(kind, id, fields, count)
  local t = #taken
  taken[t + 1], taken[t + 2], taken[t + 3], taken[t + 4] = kind, id, fields, count
  n = n + 1
end
-- 1. leases that ran out: an entry idle in a consumer's PEL for longer than that
--    consumer's lease (its name ends in /L<ms>). XCLAIM with that min-idle re-checks it
--    and counts a delivery; the entry is leased to us from now.
local function reclaim(kind, stream)
  for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', stream, group)) do
    if n >= max then return end
    local name, pending
    for i = 1, #c, 2 do
      if c[i] == 'name' then name = c[i + 1] elseif c[i] == 'pending' then pending = c[i + 1] end
    end
    local lease = tonumber(string.match(name, '/L(%d+)$'))
    if lease and pending > 0 then
      local idle = redis.call('XPENDING', stream, group, 'IDLE', lease, '-', '+', max - n, name)
      for _, p in ipairs(idle) do
        local e = redis.call('XCLAIM', stream, group, me, lease, p[1])[1]
        if e then
          hand(kind, e[1], e[2], tonumber(p[4]) + 1)
          reclaimed = reclaimed + 1
        end
      end
    end
  end
end
-- 2. due entries (owned by park): XCLAIM moves them to us and counts a delivery
local function claim_due(kind, stream, due)
  if n >= max then return end
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', due, '-inf', now, 'LIMIT', 0, max - n)) do
    redis.call('ZREM', due, id)
    local e = redis.call('XCLAIM', stream, group, me, 0, id)[1]
    if e then  -- else deleted from the stream by hand; XCLAIM dropped it from the PEL
      local p = redis.call('XPENDING', stream, group, id, id, 1)
      hand(kind, id, e[2], p[1][4])
    end
  end
end
if sweep then
  reclaim('s', S)
  reclaim('f', F)
end
claim_due('s', S, DS)
claim_due('f', F, DF)
-- 3. new entries of F in stream order: the first unsettled entry of its fifo_group is
--    delivered, one behind a busy group is parked (owned by park, count 0, not due).
local rounds = 0
while n < max and rounds < 4 do
  rounds = rounds + 1
  local r = redis.call('XREADGROUP', 'GROUP', group, me, 'COUNT', max - n, 'STREAMS', F, '>')
  if not r then break end
  local entries = r[1][2]
  if #entries == 0 then break end
  for _, e in ipairs(entries) do
    local id, f = e[1], e[2]
    local fg = ''
    for i = 1, #f, 2 do
      if f[i] == 'g' then fg = f[i + 1] break end
    end
    if redis.call('RPUSH', fprefix .. fg, id) > 1 then
      redis.call('XCLAIM', F, group, park, 0, id, 'RETRYCOUNT', 0, 'JUSTID')
    else
      hand('f', id, f, 1)
    end
  end
end
local out = {now, false, false, false, false, taken, reclaimed}
-- 4. nothing to hand out: tell the caller what to block on and for how long
if n == 0 then
  local a = redis.call('ZRANGE', DS, 0, 0, 'WITHSCORES')[2]
  local b = redis.call('ZRANGE', DF, 0, 0, 'WITHSCORES')[2]
  if a and b then
    out[2] = math.min(tonumber(a), tonumber(b))
  else
    out[2] = a or b or false
  end
  for k, stream in ipairs({S, F}) do
    for _, g in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
      if g[2] == group then
        for i = 1, #g, 2 do
          if g[i] == 'last-delivered-id' then out[2 + k] = g[i + 1] end
        end
      end
    end
  end
  local last = redis.call('XREVRANGE', bell, '+', '-', 'COUNT', 1)
  if last[1] then out[5] = last[1][1] end
end
return out
"""
)

ACK = (
    _COMMON
    + """
-- KEYS: S, F, due of F, bell.  ARGV: group, consumer, fifo prefix, then ONE packed
-- argument of lines "<id> <count> <fifo_group or nothing>" + newline (far cheaper to send
-- than 3 arguments per ack). Returns the ids whose lease was lost (not acked).
-- The leases of S entries are checked with one XPENDING over this consumer's oldest pending
-- entries of S (acks come mostly in delivery order, so those are the ones being acked); an
-- id not in that answer (it was cut short) is checked alone. Then one XACK per chunk.
-- Entries of F settle one by one (their fifo_group's next entry becomes due).
local S, F, DF, bell = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local group, me, fprefix = ARGV[1], ARGV[2], ARGV[3]
local now = now_ms()
local lost, wake = {}, false
local bid, bcount, bfg, nb, ns = {}, {}, {}, 0, 0
for id, count, fg in string.gmatch(ARGV[4], '(%S+) (%d+) ([^\\n]*)\\n') do
  nb = nb + 1
  bid[nb], bcount[nb], bfg[nb] = id, count, fg
  if fg == '' then ns = ns + 1 end
end
local mine, complete = {}, true
if ns > 0 then
  local want = ns + 64
  local pel = redis.call('XPENDING', S, group, '-', '+', want, me)
  for _, p in ipairs(pel) do mine[p[1]] = p[4] end
  complete = #pel < want
end
local plain, pn = {}, 0
local function flush_plain()
  if pn > 0 then
    redis.call('XACK', S, group, unpack(plain, 1, pn))
    pn = 0
  end
end
for i = 1, nb do
  local id, count, fg = bid[i], bcount[i], bfg[i]
  if fg == '' then
    local have, ok = mine[id], false
    if have then
      ok = have == tonumber(count)
    elseif not complete then
      ok = holds(S, group, me, id, count)
    end
    if ok then
      pn = pn + 1
      plain[pn] = id
      if pn >= 1000 then flush_plain() end
    else
      lost[#lost + 1] = id
    end
  elseif holds(F, group, me, id, count) then
    if settle_fifo(F, group, DF, fprefix, id, fg, now) then wake = true end
  else
    lost[#lost + 1] = id
  end
end
flush_plain()
if wake then ring(bell) end
return lost
"""
)

ACK_BARE = """
-- KEYS: stream.  ARGV: group, the ids separated by spaces.  XACK them, with no lease check
-- (the receiver sends only batches whose leases surely hold, see _flush_batch). One packed
-- argument: redis-py packs each command argument in Python, ~0.7 us apiece.
local ids, n = {}, 0
for id in string.gmatch(ARGV[2], '%S+') do
  n = n + 1
  ids[n] = id
end
if n == 0 then return 0 end
return redis.call('XACK', KEYS[1], ARGV[1], unpack(ids, 1, n))
"""

NACK = (
    _COMMON
    + """
-- KEYS: S, due of S, F, due of F, bell.  ARGV: group, consumer, park consumer, delay_ms,
-- uncount ('1'|'0'), then (id, count, kind 's'|'f')*.  The entry goes to park (so the old
-- token dies) and is due after the delay; a fifo head stays its group's head, so the group
-- stays held.  uncount gives the delivery back without counting it (release of deliveries
-- never shown to the caller).  Entries given together become due in the order given (a
-- microsecond apart: equal ZSET scores would sort by id as text, '1-10' before '1-9').
local group, me, park, delay, uncount = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5]
local now = now_ms()
local lost = {}
local order = 0
for i = 6, #ARGV, 3 do
  local id, count, kind = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2]
  local stream, due = KEYS[1], KEYS[2]
  if kind == 'f' then stream, due = KEYS[3], KEYS[4] end
  if holds(stream, group, me, id, count) then
    if uncount == '1' then
      local back = math.max(count - 1, 0)
      redis.call('XCLAIM', stream, group, park, 0, id, 'RETRYCOUNT', back, 'JUSTID')
    else
      redis.call('XCLAIM', stream, group, park, 0, id, 'JUSTID')
    end
    redis.call('ZADD', due, now + delay + order * 0.001, id)
    order = order + 1
  else
    lost[#lost + 1] = id
  end
end
redis.call('XADD', KEYS[5], 'MAXLEN', 1, '*', 'r', '1')
return lost
"""
)

DEAD = (
    _COMMON
    + """
-- KEYS: stream (S or F), due of F, bell, DLQ stream (the DLQ's S or F).  ARGV: group,
-- consumer, fifo prefix, id, count, fifo_group or '', kind ('s' | 'f': the stream), then
-- the DLQ entry's fields. Copy to the DLQ and ack in one step. An entry of F settles in
-- the list TAKE routed it to: the one of its own g field, read here (a damaged entry's g,
-- not UTF-8 or missing, is not what the client could pass; missing routes to '').
local stream, due, bell, dlq = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local group, me, fprefix, id = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
if not holds(stream, group, me, id, ARGV[5]) then return 0 end
redis.call('XADD', dlq, '*', unpack(ARGV, 8))
if ARGV[7] ~= 'f' then
  redis.call('XACK', stream, group, id)
else
  local fg = ARGV[6]
  local e = redis.call('XRANGE', stream, id, id)[1]
  if e then
    fg = ''
    for i = 1, #e[2], 2 do
      if e[2][i] == 'g' then fg = e[2][i + 1] break end
    end
  end
  if settle_fifo(stream, group, due, fprefix, id, fg, now_ms()) then ring(bell) end
end
return 1
"""
)

EXTEND = (
    _COMMON
    + """
-- KEYS: stream (S or F).  ARGV: group, consumer, id, count.
-- XCLAIM to ourselves with JUSTID restarts the PEL delivery time (the implicit lease)
-- without counting a delivery.
if not holds(KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4]) then return 0 end
redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3], 'JUSTID')
return 1
"""
)

PUBLISH_DEDUP = """
-- KEYS: stream (S or F), dedup key.  ARGV: window_ms, id prefix ('' for S, 'f:' for F),
-- then the entry's fields.  Returns {id, 1} for a duplicate (the original's id), {id, 0}
-- for a new entry; ids are the public ones (prefixed).
local old = redis.call('GET', KEYS[2])
if old then return {old, 1} end
local id = ARGV[2] .. redis.call('XADD', KEYS[1], '*', unpack(ARGV, 3))
redis.call('SET', KEYS[2], id, 'PX', ARGV[1])
return {id, 0}
"""

TRIM = """
-- KEYS: stream.  Deletes the entries every consumer group has acked: those older than the
-- oldest pending entry of each group, and (for a group with an empty PEL) up to its cursor.
-- A stream without groups is kept whole: a group created later starts from the oldest entry.
local stream = KEYS[1]
local groups = redis.call('XINFO', 'GROUPS', stream)
if #groups == 0 then return 0 end
local function parse(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(seq)
end
local best_ms, best_seq = nil, nil
for _, g in ipairs(groups) do
  local name, pending, last
  for i = 1, #g, 2 do
    if g[i] == 'name' then name = g[i + 1]
    elseif g[i] == 'pending' then pending = g[i + 1]
    elseif g[i] == 'last-delivered-id' then last = g[i + 1] end
  end
  local ms, seq
  if pending > 0 then
    ms, seq = parse(redis.call('XPENDING', stream, name, '-', '+', 1)[1][1])
  else
    ms, seq = parse(last)
    seq = seq + 1
  end
  if best_ms == nil or ms < best_ms or (ms == best_ms and seq < best_seq) then
    best_ms, best_seq = ms, seq
  end
end
if best_ms == 0 and best_seq <= 1 then return 0 end
return redis.call('XTRIM', stream, 'MINID', string.format('%.0f-%.0f', best_ms, best_seq))
"""

FORGET_CONSUMER = """
-- KEYS: stream.  ARGV: group, consumer.  Deletes the consumer name when it holds nothing.
for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])) do
  local name, pending
  for i = 1, #c, 2 do
    if c[i] == 'name' then name = c[i + 1] elseif c[i] == 'pending' then pending = c[i + 1] end
  end
  if name == ARGV[2] then
    if pending == 0 then
      redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
      return 1
    end
    return 0
  end
end
return 0
"""
