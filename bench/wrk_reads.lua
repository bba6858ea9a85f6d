-- Every request a distinct resources/read (no two identical in flight), without Authorization.
local counter = 0
local prefix = os.getenv("WRK_URI_PREFIX") or "bench://wrk/"
request = function()
  counter = counter + 1
  local uri = prefix .. counter
  local body = '{"jsonrpc":"2.0","id":' .. counter .. ',"method":"resources/read","params":{"uri":"' .. uri ..
    '","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"wrk","version":"0"},"io.modelcontextprotocol/clientCapabilities":{}}}}'
  local headers = {
    ["Content-Type"] = "application/json",
    ["Accept"] = "application/json, text/event-stream",
    ["MCP-Protocol-Version"] = "2026-07-28",
    ["Mcp-Method"] = "resources/read",
    ["Mcp-Name"] = uri,
  }
  return wrk.format("POST", "/mcp", headers, body)
end
