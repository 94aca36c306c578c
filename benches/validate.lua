-- wrk script: POST /validate with the service token from the TOKEN environment variable.
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"serviceToken":"' .. os.getenv("TOKEN") .. '"}'

local failures = 0
response = function(status, headers, body)
  if status ~= 200 then failures = failures + 1 end
end

done = function(summary, latency, requests)
  io.write(string.format("non-200 responses: %d\n", summary.errors.status))
  for _, p in ipairs({50, 90, 99, 99.9}) do
    io.write(string.format("p%s latency: %.3f ms\n", p, latency:percentile(p) / 1000))
  end
end
