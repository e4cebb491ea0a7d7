// The dashboard's entry point: who is signed in (GET /whoami), a hash router (#/ the list, #/ns/<name> a
// namespace, #/audit the audit trail) and the sign-in form for a bearer token.

import { api, ApiError, setToken, token } from "./api.js";
import { h } from "./dom.js";
import { renderList } from "./list.js";
import { auditTable, renderNamespace } from "./namespace.js";

const view = document.getElementById("view");
const statusLine = document.getElementById("status");
const identity = document.getElementById("identity");
const signOut = document.getElementById("sign-out");
const nav = document.getElementById("nav");

const ctx = {
  who: null,
  status(message) {
    statusLine.textContent = message;
  },
  /** The timekeeper's clock now (its demo clock may differ from this browser's). */
  now() {
    return this.who ? new Date(this.who.now).getTime() + (Date.now() - this.whoAt) : Date.now();
  },
  navigate(hash) {
    if (location.hash === hash) route();
    else location.hash = hash;
  },
};

function signInView(message) {
  const tokenInput = h("input", {
    id: "token",
    name: "token",
    type: "password",
    required: true,
    autocomplete: "off",
    spellcheck: "false",
    "aria-describedby": "token-help",
  });
  const form = h(
    "form",
    {
      id: "sign-in",
      class: "sign-in",
      "aria-labelledby": "sign-in-title",
      onsubmit: (event) => {
        event.preventDefault();
        setToken(tokenInput.value.trim());
        start();
      },
    },
    h("h1", { id: "sign-in-title" }, "Sign in"),
    message && h("p", { class: "form-error", role: "alert", id: "sign-in-error" }, message),
    h("label", { for: "token" }, "Bearer token"),
    tokenInput,
    h(
      "div",
      { id: "token-help", class: "help" },
      h("p", {}, "The same token you give the API: a static-mode token from your administrator, or in a cluster your own Kubernetes token, for example:"),
      h("pre", {}, h("code", {}, "kubectl create token <your-service-account> -n <namespace>")),
      h("p", {}, "It is kept in this browser tab only (sessionStorage) and sent only to this timekeeper."),
    ),
    h("button", { type: "submit" }, "Sign in"),
  );
  view.replaceChildren(form);
  tokenInput.focus();
}

async function renderAudit() {
  view.replaceChildren(h("h1", {}, "Audit trail"));
  const entries = await api.audit(null, 500);
  view.append(auditTable(entries));
}

async function route() {
  if (!ctx.who) return;
  const hash = location.hash || "#/";
  if (!hash.startsWith("#/")) return; // an in-page anchor (the skip link), not a route
  try {
    const match = hash.match(/^#\/ns\/([^/?]+)/);
    if (match) {
      await renderNamespace(view, ctx, decodeURIComponent(match[1]));
    } else if (hash.startsWith("#/audit") && ctx.who.may_administer) {
      document.title = "Audit trail · GPU Timekeeper";
      await renderAudit();
    } else {
      document.title = "Namespaces · GPU Timekeeper";
      await renderList(view, ctx);
    }
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) {
      setToken(null);
      ctx.who = null;
      showIdentity();
      signInView("The token was not accepted (it may have expired). Sign in again.");
      return;
    }
    ctx.status("");
    view.replaceChildren(
      h("p", { class: "breadcrumb" }, h("a", { href: "#/" }, "All namespaces")),
      h("p", { class: "form-error", role: "alert", id: "view-error" }, error.message),
    );
  }
}

function showIdentity() {
  const who = ctx.who;
  identity.replaceChildren(
    ...(who
      ? [h("span", { class: "muted" }, "Signed in as "), h("strong", { id: "principal" }, who.name), who.may_administer ? " (admin)" : ""]
      : []),
  );
  signOut.hidden = !token();
  nav.replaceChildren(
    ...(who
      ? [h("a", { href: "#/" }, "Namespaces"), who.may_administer && h("a", { href: "#/audit", id: "nav-audit" }, "Audit trail")].filter(Boolean)
      : []),
  );
}

async function start() {
  ctx.status("Connecting…");
  try {
    ctx.who = await api.whoami();
    ctx.whoAt = Date.now();
  } catch (error) {
    ctx.status("");
    ctx.who = null;
    showIdentity();
    if (error instanceof ApiError && error.status === 401) {
      const hadToken = Boolean(token());
      setToken(null);
      signInView(hadToken ? "The token was not accepted." : null);
    } else {
      view.replaceChildren(h("p", { class: "form-error", role: "alert" }, error.message));
    }
    return;
  }
  ctx.status("");
  showIdentity();
  await route();
}

signOut.addEventListener("click", () => {
  setToken(null);
  ctx.who = null;
  showIdentity();
  signInView(null);
});
document.getElementById("skip-link").addEventListener("click", (event) => {
  event.preventDefault();
  document.getElementById("main").focus();
});
window.addEventListener("hashchange", route);
start();
