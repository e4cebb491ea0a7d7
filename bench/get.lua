-- wrk script for GET benchmarks: same summary line as reports.lua. args: <bearer token> <paths separated by ,>
local paths, index = {}, 0

function init(args)
  wrk.headers["Authorization"] = "Bearer " .. args[1]
  for path in string.gmatch(args[2], "[^,]+") do
    table.insert(paths, path)
  end
end

function request()
  index = index % #paths + 1
  return wrk.format("GET", paths[index])
end

function done(summary, latency, requests)
  io.write(string.format(
    'WRK_RESULT {"requests":%d,"duration_us":%d,"status_errors":%d,"connect_errors":%d,' ..
    '"read_errors":%d,"write_errors":%d,"timeouts":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d,"max_us":%d}\n',
    summary.requests, summary.duration, summary.errors.status, summary.errors.connect,
    summary.errors.read, summary.errors.write, summary.errors.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max))
end
