// What the dashboard and the review page share: the API key typed into the page, kept for this
// tab only (sessionStorage) and sent as a bearer token, and a fetch that turns the API's JSON
// errors into exceptions carrying their status and message.
"use strict";

function key() { return sessionStorage.getItem("tucano-key") || ""; }

async function api(path, options = {}) {
  const headers = { ...(options.headers || {}) };
  if (options.body !== undefined) headers["content-type"] = "application/json";
  if (key()) headers.Authorization = `Bearer ${key()}`;
  let response;
  try {
    response = await fetch(path, { ...options, headers });
  } catch (error) {
    throw new Error(`the gateway did not answer (${error.message})`);
  }
  const body = await response.json().catch(() => null);
  if (!response.ok) {
    const error = new Error(body && body.error ? `${body.error.type}: ${body.error.message}` : `HTTP ${response.status}`);
    error.status = response.status;
    error.detail = body && body.error ? body.error.message : null;
    throw error;
  }
  return body;
}
