"""The Lua scripts: every step that reads then writes runs as one atomic script.

Vocabulary (see docs/backends/redis.md for the invariants in full):

* ``stream`` -- the queue (or its DLQ); one Redis consumer group per brokerkit group;
* ``due`` -- ZSET per (stream, group): entry id -> when it is up for delivery next, in
  server milliseconds. A leased entry's score is its lease deadline; a nacked one's is
  the end of its delay; a fifo head made ready is scored "now". Invariant: an entry is
  in ``due`` exactly when it is in the group's PEL and may be handed out at its score;
* ``fifo list`` -- LIST per (stream, group, fifo_group) of the group's routed, unsettled
  entries in stream order. Only its head is ever in ``due``; the others are *parked*
  (in the PEL, owned by the pseudo consumer ``park``, delivery count 0);
* ``bell`` -- a one-entry stream per (stream, group); XADD to it wakes blocked readers
  when something became due now (nack, release, a fifo head made ready).

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
-- ack the entry in the group; a fifo head lets the next entry of its group become due now
local function settle(stream, group, due, fprefix, id, fg, now)
  redis.call('XACK', stream, group, id)
  redis.call('ZREM', due, id)
  if fg == '' then return false end
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
-- KEYS: stream, due, bell.  ARGV: group, consumer, max, lease_ms, fifo prefix, park consumer
-- Returns {now, next due or false, group cursor or false, bell id or false, claimed, fresh}:
-- claimed = flat (id, fields, count)* of due entries taken over; fresh = the entries
-- ({id, fields}) read with XREADGROUP and handed out with count 1, in stream order.
local stream, due, bell = KEYS[1], KEYS[2], KEYS[3]
local group, me, max, lease = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local fprefix, park = ARGV[5], ARGV[6]
local now = now_ms()
local deadline = now + lease
local claimed, fresh = {}, {}
local n = 0
-- 1. due entries: a lease ran out, a nack delay passed, or a fifo head became ready.
--    XCLAIM moves ownership to us and counts a delivery (the durable attempt).
local ids = redis.call('ZRANGEBYSCORE', due, '-inf', now, 'LIMIT', 0, max)
for _, id in ipairs(ids) do
  local got = redis.call('XCLAIM', stream, group, me, 0, id)
  local e = got[1]
  if e then
    redis.call('ZADD', due, deadline, id)
    local p = redis.call('XPENDING', stream, group, id, id, 1)
    claimed[#claimed + 1] = id
    claimed[#claimed + 1] = e[2]
    claimed[#claimed + 1] = p[1][4]
    n = n + 1
  else
    redis.call('ZREM', due, id)  -- deleted from the stream by hand; XCLAIM dropped it from the PEL
  end
end
-- 2. new entries, in stream order; a fifo entry behind a busy group is parked, not delivered.
--    Their leases go into due with one variadic ZADD per chunk (not one call per entry).
local zargs, zn = {}, 0
local function lease_flush()
  if zn > 0 then
    redis.call('ZADD', due, unpack(zargs, 1, zn))
    zn = 0
  end
end
local rounds = 0
while n < max and rounds < 4 do
  rounds = rounds + 1
  local r = redis.call('XREADGROUP', 'GROUP', group, me, 'COUNT', max - n, 'STREAMS', stream, '>')
  if not r then break end
  local entries = r[1][2]
  if #entries == 0 then break end
  for _, e in ipairs(entries) do
    local id, f = e[1], e[2]
    local deliver = true
    -- the fifo_group field 'g' comes right after the body 'b' (scan older layouts in full)
    local fg = nil
    if f[1] == 'b' then
      if f[3] == 'g' then fg = f[4] end
    else
      for i = 1, #f, 2 do
        if f[i] == 'g' then fg = f[i + 1] break end
      end
    end
    if fg and redis.call('RPUSH', fprefix .. fg, id) > 1 then
      redis.call('XCLAIM', stream, group, park, 0, id, 'RETRYCOUNT', 0, 'JUSTID')
      deliver = false
    end
    if deliver then
      fresh[#fresh + 1] = e
      zargs[zn + 1] = deadline
      zargs[zn + 2] = id
      zn = zn + 2
      if zn >= 2000 then lease_flush() end
      n = n + 1
    end
  end
end
lease_flush()
local out = {now, false, false, false, claimed, fresh}
-- 3. nothing to hand out: tell the caller what to block on and for how long
if n == 0 then
  local first = redis.call('ZRANGE', due, 0, 0, 'WITHSCORES')
  if first[2] then out[2] = first[2] end
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
    if g[2] == group then
      for i = 1, #g, 2 do
        if g[i] == 'last-delivered-id' then out[3] = g[i + 1] end
      end
    end
  end
  local b = redis.call('XREVRANGE', bell, '+', '-', 'COUNT', 1)
  if b[1] then out[4] = b[1][1] end
end
return out
"""
)

ACK = (
    _COMMON
    + """
-- KEYS: stream, due, bell.  ARGV: group, consumer, fifo prefix, then ONE packed argument of
-- lines "<id> <count> <fifo_group or nothing>" + newline (far cheaper to send than 3 per ack).
-- Returns the ids whose lease was lost (not acked).
-- The leases of the whole batch are checked with one XPENDING over this consumer's oldest
-- pending entries (acks come mostly in delivery order, so those are the ones being acked);
-- an id not in that answer (it was cut short) is checked alone. Then one XACK and one ZREM
-- per chunk of held ids without a fifo_group; fifo ones settle one by one (heads move).
local stream, due, bell = KEYS[1], KEYS[2], KEYS[3]
local group, me, fprefix = ARGV[1], ARGV[2], ARGV[3]
local now = now_ms()
local lost, wake = {}, false
local bid, bcount, bfg, nb = {}, {}, {}, 0
for id, count, fg in string.gmatch(ARGV[4], '(%S+) (%d+) ([^\\n]*)\\n') do
  nb = nb + 1
  bid[nb], bcount[nb], bfg[nb] = id, count, fg
end
local want = nb + 64
local mine = {}
local pel = redis.call('XPENDING', stream, group, '-', '+', want, me)
for _, p in ipairs(pel) do mine[p[1]] = p[4] end
local complete = #pel < want
local plain, pn = {}, 0
local function flush_plain()
  if pn > 0 then
    redis.call('XACK', stream, group, unpack(plain, 1, pn))
    redis.call('ZREM', due, unpack(plain, 1, pn))
    pn = 0
  end
end
for i = 1, nb do
  local id, count, fg = bid[i], bcount[i], bfg[i]
  local have = mine[id]
  local ok
  if have then
    ok = have == tonumber(count)
  elseif complete then
    ok = false
  else
    ok = holds(stream, group, me, id, count)
  end
  if not ok then
    lost[#lost + 1] = id
  elseif fg == '' then
    pn = pn + 1
    plain[pn] = id
    if pn >= 1000 then flush_plain() end
  else
    flush_plain()  -- keep settle order
    if settle(stream, group, due, fprefix, id, fg, now) then wake = true end
  end
end
flush_plain()
if wake then ring(bell) end
return lost
"""
)

NACK = (
    _COMMON
    + """
-- KEYS: stream, due, bell.  ARGV: group, consumer, park consumer, delay_ms, uncount ('1'|'0'),
-- then (id, count)*.  The entry goes to the park consumer (so the old token dies) and is due
-- after the delay; a fifo head stays the head, so its group stays held.  uncount gives the
-- delivery back without counting it (release of never-seen deliveries).
local stream, due, bell = KEYS[1], KEYS[2], KEYS[3]
local group, me, park, delay, uncount = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5]
local now = now_ms()
local lost = {}
for i = 6, #ARGV, 2 do
  local id, count = ARGV[i], tonumber(ARGV[i + 1])
  if holds(stream, group, me, id, count) then
    if uncount == '1' then
      local back = math.max(count - 1, 0)
      redis.call('XCLAIM', stream, group, park, 0, id, 'RETRYCOUNT', back, 'JUSTID')
    else
      redis.call('XCLAIM', stream, group, park, 0, id, 'JUSTID')
    end
    redis.call('ZADD', due, now + delay, id)
  else
    lost[#lost + 1] = id
  end
end
ring(bell)
return lost
"""
)

DEAD = (
    _COMMON
    + """
-- KEYS: stream, due, bell, dlq stream.  ARGV: group, consumer, fifo prefix, id, count,
-- fifo_group or '', then the DLQ entry's fields.  Copy to the DLQ and ack in one step.
local stream, due, bell, dlq = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local group, me, fprefix, id = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
if not holds(stream, group, me, id, ARGV[5]) then return 0 end
redis.call('XADD', dlq, '*', unpack(ARGV, 7))
if settle(stream, group, due, fprefix, id, ARGV[6], now_ms()) then ring(bell) end
return 1
"""
)

EXTEND = (
    _COMMON
    + """
-- KEYS: stream, due.  ARGV: group, consumer, id, count, lease_ms.
if not holds(KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4]) then return 0 end
redis.call('ZADD', KEYS[2], now_ms() + tonumber(ARGV[5]), ARGV[3])
return 1
"""
)

PUBLISH_DEDUP = """
-- KEYS: stream, dedup key.  ARGV: window_ms, then the entry's fields.
-- Returns {id, 1} for a duplicate (the original id), {id, 0} for a new entry.
local old = redis.call('GET', KEYS[2])
if old then return {old, 1} end
local id = redis.call('XADD', KEYS[1], '*', unpack(ARGV, 2))
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
