-- wrk script: POST one AdmissionReview (read from a file) to the path in the URL, again and again.
-- args: <file holding the review body>
dofile(debug.getinfo(1, "S").source:match("^@(.*/)") .. "wrk_summary.lua")

function init(args)
  local file = assert(io.open(args[1], "rb"))
  wrk.body = file:read("*a")
  file:close()
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
end
