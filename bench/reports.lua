-- wrk script: every request is a distinct sidecar report (unique pod_uid and seq, contiguous intervals).
-- args: <base epoch seconds> <pods per thread> <bearer token> <namespaces> [<client id>]
-- (client id: distinct per concurrent wrk process, so their pods never collide)
dofile(debug.getinfo(1, "S").source:match("^@(.*/)") .. "wrk_summary.lua")
local thread_count = 0
local counter, tid, base, pods, namespaces = 0, 0, 0, 1000, 100

function setup(thread)
  thread:set("tid", thread_count)
  thread_count = thread_count + 1
end

function init(args)
  base = tonumber(args[1])
  pods = tonumber(args[2])
  namespaces = tonumber(args[4])
  tid = tid + 1000 * tonumber(args[5] or "0")
  wrk.method = "POST"
  wrk.path = "/api/v1/reports"
  wrk.headers["Content-Type"] = "application/json"
  wrk.headers["Authorization"] = "Bearer " .. args[3]
end

local template = '{"namespace":"bench-%d","pod":"pod-%d-%d","pod_uid":"%08x-0000-4000-8000-%012x",'
  .. '"seq":%d,"interval_start":"%s","interval_end":"%s","gpu_share":0.5,'
  .. '"gpus":[{"uuid":"GPU-00000000-0000-0000-0000-000000000000","sm_util_pct":50.0,'
  .. '"mem_used_bytes":1073741824,"mem_total_bytes":85899345920,"name":"NVIDIA H100 80GB HBM3"}],'
  .. '"final":false}'

function request()
  local pod = counter % pods
  local seq = math.floor(counter / pods)
  counter = counter + 1
  local start = base + seq * 30
  local body = string.format(template, pod % namespaces, tid, pod, tid, pod, seq,
    os.date("!%Y-%m-%dT%H:%M:%SZ", start), os.date("!%Y-%m-%dT%H:%M:%SZ", start + 30))
  return wrk.format(nil, nil, nil, body)
end
