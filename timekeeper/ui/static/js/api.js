// The timekeeper's /api/v1, called with the user's own bearer token (kept in this tab's sessionStorage
// only: it is gone when the tab closes and is never sent anywhere but this origin).

const TOKEN_KEY = "gpu-timekeeper-token";
const BASE = new URL("../api/v1/", document.baseURI);

export class ApiError extends Error {
  constructor(status, detail) {
    super(describe(status, detail));
    this.status = status;
    this.detail = detail;
  }
}

function describe(status, detail) {
  if (Array.isArray(detail)) {
    // pydantic's list of errors: "budget_gpu_minutes: Input should be greater than or equal to 0"
    return detail.map((e) => `${(e.loc || []).filter((p) => p !== "body").join(".")}: ${e.msg}`).join("; ");
  }
  if (typeof detail === "string" && detail) return detail;
  return `the timekeeper answered ${status}`;
}

export function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

export function setToken(value) {
  if (value) sessionStorage.setItem(TOKEN_KEY, value);
  else sessionStorage.removeItem(TOKEN_KEY);
}

export async function call(method, path, { query, body } = {}) {
  const url = new URL(path.replace(/^\//, ""), BASE);
  for (const [key, value] of Object.entries(query || {})) {
    if (value !== null && value !== undefined) url.searchParams.set(key, value);
  }
  const headers = { Accept: "application/json" };
  const bearer = token();
  if (bearer) headers.Authorization = `Bearer ${bearer}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let response;
  try {
    response = await fetch(url, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      credentials: "omit",
      cache: "no-store",
    });
  } catch (error) {
    throw new ApiError(0, `the timekeeper is unreachable (${error.message})`);
  }
  const text = await response.text();
  let payload = null;
  try {
    payload = text ? JSON.parse(text) : null;
  } catch {
    payload = null;
  }
  if (!response.ok) throw new ApiError(response.status, payload && payload.detail);
  return payload;
}

export const api = {
  whoami: (namespace) => call("GET", "whoami", { query: { namespace } }),
  namespaces: () => call("GET", "namespaces"),
  budget: (ns) => call("GET", `namespaces/${encodeURIComponent(ns)}/budget`),
  usage: (ns, groupBy, since) =>
    call("GET", `namespaces/${encodeURIComponent(ns)}/usage`, { query: { group_by: groupBy, since } }),
  audit: (namespace, limit = 100) => call("GET", "audit", { query: { namespace, limit } }),
  putBudget: (ns, body) => call("PUT", `namespaces/${encodeURIComponent(ns)}/budget`, { body }),
  deleteBudget: (ns) => call("DELETE", `namespaces/${encodeURIComponent(ns)}/budget`),
  grant: (ns, body) => call("POST", `namespaces/${encodeURIComponent(ns)}/grants`, { body }),
  grants: (ns) => call("GET", `namespaces/${encodeURIComponent(ns)}/grants`, { query: { limit: 100 } }),
  revokeGrant: (ns, id) => call("DELETE", `namespaces/${encodeURIComponent(ns)}/grants/${encodeURIComponent(id)}`),
};
