-- wrk script for GET benchmarks; the summary line comes from wrk_summary.lua. args: <bearer token> <paths separated by ,>
dofile(debug.getinfo(1, "S").source:match("^@(.*/)") .. "wrk_summary.lua")
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
