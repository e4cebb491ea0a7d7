-- The WRK_RESULT summary line bench/wrk.py reads; a wrk script loads it with dofile and gets done().
function done(summary, latency, requests)
  io.write(string.format(
    'WRK_RESULT {"requests":%d,"duration_us":%d,"status_errors":%d,"connect_errors":%d,' ..
    '"read_errors":%d,"write_errors":%d,"timeouts":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d,"max_us":%d}\n',
    summary.requests, summary.duration, summary.errors.status, summary.errors.connect,
    summary.errors.read, summary.errors.write, summary.errors.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max))
end
